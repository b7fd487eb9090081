"""The Sources page's one-click samples: other systems' files shipped in ``fixtures/samples/``,
each imported into its own stream (``sample_<system>_<what>``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spark_backend.cache.store import Cache
from spark_backend.model.errors import InspectorError

from .pulling import Outcome, import_message

ROOT = Path(__file__).resolve().parent.parent  # the project root, as in app/main.py


@dataclass(frozen=True)
class Sample:
    key: str                 # the button's key
    label: str               # the button's text
    stream: str              # the stream in the cache it lands in
    fmt: str                 # the import format
    path: str                # relative to the project root
    options: dict[str, str] = field(default_factory=dict)
    help: str = ""

    @property
    def file(self) -> Path:
        return ROOT / self.path


SAMPLES: tuple[Sample, ...] = (
    Sample("sample_datastream_mysql", "Datastream · MySQL JSON", "sample_datastream_mysql",
           "datastream", "fixtures/samples/datastream/mysql_events.jsonl",
           help="Datastream events from MySQL (JSON Lines), ordered by log file and position."),
    Sample("sample_datastream_oracle", "Datastream · Oracle Avro", "sample_datastream_oracle",
           "datastream", "fixtures/samples/datastream/oracle_events.avro",
           help="Datastream events from Oracle (Avro), ordered by SCN, rs_id and ssn."),
    # The wrapped+diff message carries no topic and is no cloud storage file, so the table is
    # named with the `--table` option; its row (rider, vehicle, revenue) is MovR's `rides`.
    Sample("sample_cockroachdb_diff", "CockroachDB · wrapped + diff", "sample_cockroachdb_diff",
           "cockroachdb", "fixtures/samples/cockroachdb/wrapped_diff.ndjson",
           options={"table": "rides"},
           help="A changefeed message in the wrapped envelope with `before` (diff)."),
    Sample("sample_bigtable_split_merge", "Bigtable · split and merge",
           "sample_bigtable_split_merge", "bigtable", "fixtures/samples/bigtable/split_merge.jsonl",
           help="ReadChangeStream responses whose close-stream messages split and merge."),
)


def by_key(key: str) -> Sample:
    return next(s for s in SAMPLES if s.key == key)


def load(cache: Cache, sample: Sample, progress=None) -> Outcome:
    """Import one sample into its stream; the outcome says records and bad lines."""
    from spark_backend.jobs.files import import_files

    try:
        res = import_files(cache, sample.stream, sample.fmt, [str(sample.file)],
                           dict(sample.options), progress=progress)
    except (InspectorError, ValueError) as e:  # BadInput: e.g. the sample file is missing
        return Outcome(False, f"{sample.label}: {e}", stream=sample.stream)
    return Outcome(True, import_message(res), stream=sample.stream)
