"""What a pull's task results take on their way to the driver (``packing.packed``): a batch
of the demo world's data change records as the readers yield it, its Arrow size plain and with
``DICTIONARY_COLUMNS`` dictionary-encoded (what the driver decodes when the batch lands), and
its packed size and pack/unpack times with LZ4 (what the project used before) and with the
project's codec (``PACKED_CODEC``: what the JVM and the driver hold until then). Times are
medians over ``--repeat`` rounds, each round measuring every variant in turn.

    python benchmarks/packed_results.py --rows 8192
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _batch(rows: int):
    from spark_backend.demo.world import build_world
    from spark_backend.model.records import from_change_record, to_arrow_batch

    world = build_world(seed=7, scale=1.0)
    records = (from_change_record(record, token)
               for token, record in world.all_data_change_records())
    return to_arrow_batch(list(itertools.islice(records, rows)))


def main(argv: list[str] | None = None) -> int:
    from spark_backend.spark.packing import DICTIONARY_COLUMNS, PACKED_CODEC, packed, unpacked

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)

    batch = _batch(args.rows)
    variants = {
        "plain, LZ4": ((), ("lz4", None)),
        "dictionary, LZ4": (DICTIONARY_COLUMNS, ("lz4", None)),
        f"dictionary, {PACKED_CODEC[0]} {PACKED_CODEC[1]} (project)": (DICTIONARY_COLUMNS,
                                                                      PACKED_CODEC),
    }
    times: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v in variants}
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeat):
        for name, (encoded, codec) in variants.items():
            t0 = time.perf_counter()
            row = packed(batch, encoded, codec)
            t1 = time.perf_counter()
            (back,) = unpacked([row])
            t2 = time.perf_counter()
            times[name][0].append(t1 - t0)
            times[name][1].append(t2 - t1)
            sizes[name] = (row.column(0)[0].as_buffer().size, back.nbytes)
    print(f"{batch.num_rows:,} demo data change records; plain Arrow {batch.nbytes / 1e6:.2f} MB "
          f"({batch.nbytes / batch.num_rows:.0f} B/record)")
    base = sizes["plain, LZ4"][0]
    for name, (packed_bytes, held) in sizes.items():
        pack, unpack = (statistics.median(t) * 1e3 for t in times[name])
        print(f"  {name:<34} packed {packed_bytes / 1e6:6.3f} MB ({packed_bytes / base:4.0%} of "
              f"plain LZ4), decoded when it lands {held / 1e6:5.2f} MB, pack {pack:5.1f} ms, "
              f"unpack {unpack:4.1f} ms (medians of {args.repeat})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
