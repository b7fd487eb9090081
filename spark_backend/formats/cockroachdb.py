"""CockroachDB changefeed messages (``--format cockroachdb``).

A file is JSON Lines as sinks write them (reference doc 002, "Changefeed messages"); ``.gz`` files
are decompressed. Every envelope of the doc is recognised line by line:

- **wrapped** (default): ``{"after": {...}|null, "key": [...], "updated": "...",
  "before": {...}|null (with diff), "topic": "..."}``; ``key`` may be missing (Kafka).
- **Kafka key + value** as the doc prints them: ``[1] {"after": null}``, ``[1] {"id": 1, ...}``.
- **bare**: the row at top level with metadata in ``__crdb__`` (``key``, ``updated``, ``topic``,
  ``resolved``).
- **key_only**: a bare key array ``["boston", "2222..."]``, or the sinkless form
  ``{"key": "[...]", "table": "users", "value": ""}`` (a non-empty ``value`` is the message text).
- **row**: the row alone (``{"city": ..., "type": ...}``), also a CDC query's output. With
  ``--option envelope=row`` every object is read as this envelope, except the sink's resolved
  messages (``{"__crdb__": {"resolved": ...}}`` or ``{"resolved": ...}``) and deletes: a key
  with a null or empty value (a tombstone: ``[5] null``, a bare key array, or the sinkless
  ``{"key": "[5]", "table": ..., "value": ""}``) is a DELETE.
- **resolved**: ``{"resolved": "..."}`` (a cloud storage ``.RESOLVED`` file holds one).
- **webhook batch**: ``{"payload": [message, ...], "length": n}``: every message is imported
  (``line`` = the batch's line, ``extra.batch_index`` = its place in the batch).
- **cloud storage sink files** (``<timestamp>-<uniquer>-<topic>-<schema id>.ndjson``): lines as
  above; the topic in the file name names the table when the messages do not.

Mapping to ``records.RECORD_FIELDS``:

- A row change -> ``kind='data_change'``; ``ts_ns`` = the wall time (nanoseconds) of ``updated``
  (an HLC decimal ``"<wall ns>.<logical>"``; ``mvcc_timestamp`` when ``updated`` is absent; a
  message with neither has no time: ``ts_ns`` is None and the cache stores no commit
  timestamp, ``extra.timestamp`` = ``"none"``; never the epoch). The exact HLC text is in
  ``extra.updated``.
- ``table_name``: the message's ``topic`` (or ``table``), else the ``table`` option (``--table``),
  else the topic in the cloud storage file name, else None.
- ``mod_type``: ``after`` null, or a Kafka key with a null value -> DELETE; with ``diff`` (a
  ``before`` field) ``before`` null -> INSERT, else UPDATE. Without ``diff`` a changefeed
  cannot tell an insert from an update: the first version of a key seen in the file is INSERT,
  later ones UPDATE (``extra.mod_type_inferred`` = true). ``key_only`` messages are UPDATE.
- ``mods``: one mod; ``keys`` = ``{"key": [...the key array...]}`` (the doc's key has no column
  names), or ``{column: value}`` when the ``primary_key`` option names the key columns
  (comma-separated; those columns then leave new/old values). ``new_values`` = ``after``,
  ``old_values`` = ``before`` (diff), DELETE: ``old_values`` = ``before`` or ``{}``.
- ``record_id`` = ``crdb|table|key|HLC``: a message delivered again (at-least-once) counts as a
  duplicate. Without a timestamp the content is hashed instead.
- ``order_key`` = HLC zero-padded (``<20-digit wall>.<10-digit logical>``) + ``|key``: the
  changefeed's own happens-before order across keys.
- ``partition_token`` = ``changefeed`` (the ``partition`` option overrides it).
- ``resolved`` -> ``kind='heartbeat'``: ``ts_ns`` = wall time, ``extra.resolved`` = exact text.
  The stream's watermark is the highest resolved timestamp seen
  (``analysis.systems.stream_watermark``).
- ``extra.line``/``extra.batch_index`` record the delivery position, which the per-key ordering
  check (``analysis.systems.system_anomalies``) uses.

Bad input (never raises): not JSON (truncated line), an unknown envelope, a message of another
system, an Avro/binary file: one ``bad`` row naming the file and line with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from spark_backend.formats.lines import read_part
from spark_backend.model.records import bad_row, canonical_json

FORMAT = "cockroachdb"
SYSTEM = "cockroachdb"
DEFAULT_PARTITION = "changefeed"

_HLC = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*$")
_DECODER = json.JSONDecoder()
_CLOUD_FILE = re.compile(r"^\d{20,}-")


class MessageError(ValueError):
    """A line that is not a changefeed message."""


def parse_hlc(text: Any) -> tuple[int, int]:
    """'1701102296662969433.0000000000' -> (wall ns, logical)."""
    if not isinstance(text, str):
        raise MessageError(f"timestamp {text!r} is not an HLC decimal string")
    m = _HLC.match(text)
    if not m:
        raise MessageError(f"timestamp {text!r} is not an HLC decimal string (<wall ns>.<logical>)")
    return int(m.group(1)), int(m.group(2) or 0)


def hlc_order(wall: int, logical: int) -> str:
    return f"{wall:020d}.{logical:010d}"


def topic_from_filename(path: str) -> str | None:
    """Cloud storage sink file '<ts>-<session>-<node>-<sink>-<file id>-<topic>-<schema>.ndjson'."""
    name = os.path.basename(path)
    for ext in (".gz", ".ndjson", ".json", ".jsonl"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    if not _CLOUD_FILE.match(name):
        return None
    parts = name.split("-")
    if len(parts) < 7:
        return None
    topic = "-".join(parts[5:-1])
    return topic or None


def splittable(head: bytes) -> bool:
    """Yes: every message stands on its own, but for the mod type inferred without ``diff``
    (the first version of a key in the file is its INSERT), which a part can only tell of the
    keys it saw; ``import_sql`` makes the later versions of a key UPDATE once every part
    landed."""
    return True


# ``import_sql`` works on one share of the keys at a time (by hash), so that its per-key
# table holds an eighth of a file's keys within an import's DuckDB memory
# (config.IMPORT_MEMORY_LIMIT); one window over the whole file ran out of it.
_KEY_SHARES = 8


def _crdb(t: str, *, of_the_import: bool = True) -> dict[str, str]:
    """SQL of table ``t``'s changefeed records: its rows (of the import, or with
    ``of_the_import=False`` of any import of the files it read), key, position."""
    which = (f"{t}.pull_id = ?" if of_the_import else
             f"""{t}.origin IN (SELECT DISTINCT origin FROM data_change_records
                                WHERE stream = ? AND pull_id = ?)""")
    return {
        "rows": f"""{t}.stream = ? AND {which} AND {t}.record_id LIKE 'crdb|%'
            AND NOT regexp_matches({t}.record_id, '[|][{{][}}][|][^|]*$')""",
        "key": f"regexp_replace({t}.record_id, '[|][^|]*$', '')",
        "position": f"""[CAST({t}.extra->>'line' AS BIGINT),
            coalesce(CAST({t}.extra->>'batch_index' AS BIGINT), -1)]""",
    }


def import_sql(stream: str, pull_id: int) -> list[tuple[str, list[Any]]]:
    """Statements run once an import's parts landed: a data change whose mod type was
    inferred INSERT while an earlier message of the same file (by line and place in a webhook
    batch) had the same table and key becomes UPDATE, as if the file had been read in one
    piece. The key is the ``record_id`` without its last field (``crdb|table|key``); each
    inferred INSERT is compared with its key's first version in the file, which may have
    landed with an earlier import of the same file (one that has grown since): this import
    counts it as a duplicate and keeps no copy of its own."""
    a, d = _crdb("a", of_the_import=False), _crdb("d")
    sql = f"""
        UPDATE data_change_records AS d SET mod_type = 'UPDATE'
        FROM (SELECT a.origin, {a["key"]} AS crdb_key, min({a["position"]}) AS first
              FROM data_change_records AS a
              WHERE {a["rows"]} AND hash(a.origin, {a["key"]}) % {_KEY_SHARES} = ?
              GROUP BY ALL) AS f
        WHERE {d["rows"]} AND d.mod_type = 'INSERT'
          AND (d.extra->>'mod_type_inferred') = 'true'
          AND d.origin = f.origin AND {d["key"]} = f.crdb_key AND {d["position"]} > f.first"""
    return [(sql, [stream, stream, pull_id, share, stream, pull_id])
            for share in range(_KEY_SHARES)]


def not_lines(stream, head: bytes, origin: str, options: dict[str, str], first: int = 1):
    """An Avro container is refused with why (changefeeds write Avro through a registry)."""
    if head != b"Obj\x01":
        return None
    return iter([bad_row(
        origin, 1, "",
        "an Avro object container file, not changefeed JSON messages "
        "(format=avro changefeeds go through a schema registry; import JSON messages)",
    )])


def parse_file(path: str, options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    return read_part(sys.modules[__name__], path, options)


class Parser:
    """Changefeed messages -> rows (``formats.lines``), one file in order."""

    def __init__(self, path: str, options: dict[str, str]):
        self.path = path
        self.options = options
        self.file_topic = topic_from_filename(path)
        self.partition = options.get("partition") or DEFAULT_PARTITION
        pk = options.get("primary_key") or options.get("keys")
        self.key_columns = [c.strip() for c in pk.split(",") if c.strip()] if pk else None
        self.forced = (options.get("envelope") or "").lower() or None
        self.seen_keys: set[tuple[str | None, str]] = set()

    def bad(self, number: int, text: str, reason: str) -> dict[str, Any]:
        return bad_row(self.path, number, text, reason)

    def line(self, number: int, text: str) -> Iterator[dict[str, Any]]:
        try:
            values = _decode_values(text)
        except MessageError as e:
            yield self.bad(number, text, str(e))
            return
        try:
            if len(values) == 2:
                key, value = values
                if not isinstance(key, list):
                    raise MessageError("a Kafka key + value line must start with the key array")
                if value is None:  # the doc's delete: the key and a null value (a tombstone)
                    rows = [self.tombstone(number, None, key, {})]
                else:
                    rows = list(self.message(value, number, None, key=key))
            else:
                (value,) = values
                if isinstance(value, dict) and "payload" in value and "length" in value:
                    rows = list(self.webhook(value, number, text))
                else:
                    rows = list(self.message(value, number, None))
        except MessageError as e:
            yield self.bad(number, text, str(e))
            return
        yield from rows

    def webhook(self, batch: dict[str, Any], number: int, text: str) -> Iterator[dict[str, Any]]:
        payload = batch.get("payload")
        if not isinstance(payload, list):
            raise MessageError("a webhook batch's payload must be an array of messages")
        out = []
        for i, msg in enumerate(payload):
            try:
                out.extend(self.message(msg, number, i))
            except MessageError as e:
                out.append(self.bad(number, json.dumps(msg), f"webhook message {i}: {e}"))
        length = batch.get("length")
        if length != len(payload):
            out.append(self.bad(
                number, text,
                f"webhook batch says length {length!r} but holds {len(payload)} messages "
                "(a batch cut short?)",
            ))
        yield from out

    # --- one message --------------------------------------------------------------------------

    def message(
        self, value: Any, number: int, index: int | None, key: list | None = None,
    ) -> Iterator[dict[str, Any]]:
        if isinstance(value, list) and self.forced == "row":  # a key without a value: deleted
            yield self.tombstone(number, index, value, {})
            return
        if isinstance(value, list):  # key_only: the key alone
            yield self.change(
                number, index, envelope="key_only", key=value, after=None, before=None,
                has_before=False, meta={}, key_only=True,
            )
            return
        if not isinstance(value, dict):
            raise MessageError(
                f"unknown envelope: a changefeed message is a JSON object or key array, "
                f"not {type(value).__name__}"
            )
        if self.forced == "row":
            yield from self.row_message(value, number, index, key)
            return
        _reject_other_formats(value)
        if "__crdb__" in value:
            meta = value["__crdb__"]
            if not isinstance(meta, dict):
                raise MessageError("unknown envelope: __crdb__ must be an object")
            if "resolved" in meta and len(value) == 1:
                yield self.resolved(meta["resolved"], number, index, "bare")
                return
            row = {k: v for k, v in value.items() if k != "__crdb__"}
            yield self.change(
                number, index, envelope="bare", key=meta.get("key", key), after=row, before=None,
                has_before=False, meta=meta,
            )
            return
        if "resolved" in value and "after" not in value:
            yield self.resolved(value["resolved"], number, index, "resolved")
            return
        if "after" in value or "before" in value:
            after = value.get("after")
            before = value.get("before")
            if after is not None and not isinstance(after, dict):
                raise MessageError("unknown envelope: after must be an object or null")
            if before is not None and not isinstance(before, dict):
                raise MessageError("unknown envelope: before must be an object or null")
            extra_fields = set(value) - {
                "after", "before", "key", "updated", "mvcc_timestamp", "topic", "table",
            }
            if extra_fields:
                raise MessageError(
                    "unknown envelope: unexpected fields " + ", ".join(sorted(extra_fields))
                )
            yield self.change(
                number, index, envelope="wrapped", key=value.get("key", key), after=after,
                before=before, has_before="before" in value, meta=value,
            )
            return
        if set(value) <= {"key", "table", "value", "topic"} and isinstance(value.get("key"), str):
            yield from self.sinkless(value, number, index)
            return
        # anything else is a row on its own (envelope=row, or bare without metadata)
        yield self.change(number, index, envelope="row", key=key, after=value, before=None,
                          has_before=False, meta={})

    def sinkless(self, value: dict[str, Any], number: int, index: int | None
                 ) -> Iterator[dict[str, Any]]:
        """A sinkless changefeed's message: key (JSON text), table, value (JSON text, or ""
        for key_only)."""
        try:
            skey = json.loads(value["key"]) if value["key"] else None
        except json.JSONDecodeError as e:
            raise MessageError(f"sinkless message key is not JSON ({e.msg})") from e
        inner = value.get("value")
        table = value.get("table") or value.get("topic")
        if inner in (None, ""):
            yield self.change(
                number, index, envelope="key_only", key=skey, after=None, before=None,
                has_before=False, meta={"topic": table}, key_only=True,
            )
            return
        try:
            inner_value = json.loads(inner) if isinstance(inner, str) else inner
        except json.JSONDecodeError as e:
            raise MessageError(f"sinkless message value is not JSON ({e.msg})") from e
        for row in self.message(inner_value, number, index, key=skey):
            if table and row.get("kind") == "data_change" and row.get("table_name") is None:
                row["table_name"] = table
            yield row

    def row_message(self, value: dict[str, Any], number: int, index: int | None,
                    key: list | None) -> Iterator[dict[str, Any]]:
        """``envelope=row``: the row alone, but the sink still sends resolved messages
        (``{"__crdb__": {"resolved": ...}}`` or ``{"resolved": ...}``) and, for a deleted row,
        its key with an empty value (a tombstone)."""
        meta = value.get("__crdb__")
        if set(value) == {"__crdb__"} and isinstance(meta, dict) and "resolved" in meta:
            yield self.resolved(meta["resolved"], number, index, "row")
            return
        if set(value) == {"resolved"}:
            yield self.resolved(value["resolved"], number, index, "row")
            return
        if set(value) <= {"key", "table", "value", "topic"} and isinstance(value.get("key"), str):
            try:  # sinkless: key and value as JSON text
                skey = json.loads(value["key"]) if value["key"] else None
                inner = value.get("value")
                inner = json.loads(inner) if isinstance(inner, str) and inner else inner
            except json.JSONDecodeError as e:
                raise MessageError(f"sinkless message key or value is not JSON ({e.msg})") from e
            meta = {"topic": value.get("table") or value.get("topic")}
            if inner in (None, "", {}):
                yield self.tombstone(number, index, skey, meta)
                return
            if not isinstance(inner, dict):
                raise MessageError("a row envelope's value must be a JSON object")
            yield self.change(number, index, envelope="row", key=skey, after=inner, before=None,
                              has_before=False, meta=meta)
            return
        yield self.change(number, index, envelope="row", key=key, after=value, before=None,
                          has_before=False, meta={})

    def tombstone(self, number: int, index: int | None, key: Any,
                  meta: dict[str, Any]) -> dict[str, Any]:
        """A key with a null or empty value: the row was deleted (reference doc, "Delete
        messages")."""
        return self.change(number, index, envelope=self.forced or "kafka", key=key, after=None,
                           before=None, has_before=False, meta=meta)

    def resolved(self, text: Any, number: int, index: int | None, envelope: str) -> dict:
        wall, logical = parse_hlc(text)
        extra = {"system": "cockroachdb", "resolved": text, "envelope": envelope,
                 "origin": self.path, "line": number, "batch_index": index}
        return {
            "partition_token": self.partition,
            "kind": "heartbeat",
            "ts_ns": wall,
            "order_key": hlc_order(wall, logical),
            "extra": canonical_json(extra),
            "origin": self.path,
            "line": number,
        }

    def finish(self) -> Iterator[dict[str, Any]]:
        return iter(())

    def change(
        self, number: int, index: int | None, *, envelope: str, key: Any, after: Any,
        before: Any, has_before: bool, meta: dict[str, Any], key_only: bool = False,
    ) -> dict[str, Any]:
        key = _key_array(key)
        table = (
            meta.get("topic") or meta.get("table") or self.options.get("table")
            or self.file_topic
        )
        wall, logical, ts_source = _message_time(meta)
        keys, values_after, values_before = self.keys_and_values(key, after, before)
        key_text = canonical_json(keys)
        mod_type, inferred = self.mod_type(table, key_text, after, before, has_before, key_only)
        if keys:
            self.seen_keys.add((table, key_text))
        mod = {"keys": keys, "new_values": {} if mod_type == "DELETE" else values_after or {},
               "old_values": values_before or {}}
        if wall is not None:
            identity = hlc_order(wall, logical)
            order = f"{identity}|{key_text}"
        else:
            body = canonical_json({"after": after, "before": before, "key": key})
            identity = "nots:" + hashlib.sha1(body.encode()).hexdigest()
            order = f"{hlc_order(0, 0)}|L{number:012d}.{(index or 0):06d}"
        extra = {
            "system": "cockroachdb", "envelope": envelope, "updated": meta.get("updated"),
            "mvcc_timestamp": meta.get("mvcc_timestamp"), "timestamp": ts_source,
            "topic": meta.get("topic") or meta.get("table"), "key": key, "diff": has_before,
            "mod_type_inferred": inferred, "line": number, "batch_index": index,
        }
        return {
            "partition_token": self.partition,
            "kind": "data_change",
            "ts_ns": wall,  # None: the message carries no time (never the epoch)
            "table_name": table,
            "mod_type": mod_type,
            "mods": canonical_json([mod]),
            "value_capture_type": (
                None if key_only else ("NEW_ROW_AND_OLD_VALUES" if has_before else "NEW_ROW")
            ),
            "server_transaction_id": None,
            "record_id": f"crdb|{table or ''}|{key_text}|{identity}",
            "order_key": order,
            "extra": canonical_json(extra),
            "origin": self.path,
            "line": number,
        }

    def keys_and_values(self, key: list | None, after: Any, before: Any
                        ) -> tuple[dict[str, Any], dict | None, dict | None]:
        """The mod's keys (named by the ``primary_key`` option, else the key array) and its
        new and old values (the key columns left out of them when named)."""
        values_after = dict(after) if isinstance(after, dict) else None
        values_before = dict(before) if isinstance(before, dict) else None
        if self.key_columns is None:
            return ({"key": key} if key is not None else {}), values_after, values_before
        source_row = values_after or values_before or {}
        if key is not None and len(key) == len(self.key_columns):
            keys = dict(zip(self.key_columns, key, strict=True))
        else:
            keys = {c: source_row.get(c) for c in self.key_columns}
        for vals in (values_after, values_before):
            if vals is not None:
                for c in self.key_columns:
                    vals.pop(c, None)
        return keys, values_after, values_before

    def mod_type(self, table: str | None, key_text: str, after: Any, before: Any,
                 has_before: bool, key_only: bool) -> tuple[str, bool]:
        """(mod type, whether it was inferred from the keys seen before in the file)."""
        if key_only:
            return "UPDATE", False
        if after is None:
            return "DELETE", False
        if has_before:
            return ("INSERT" if before is None else "UPDATE"), False
        return ("UPDATE" if (table, key_text) in self.seen_keys else "INSERT"), True


def _key_array(key: Any) -> list | None:
    if isinstance(key, str):
        try:
            key = json.loads(key)
        except json.JSONDecodeError as e:
            raise MessageError(f"key {key!r} is not a JSON array") from e
    if key is not None and not isinstance(key, list):
        raise MessageError("unknown envelope: key must be an array of primary key values")
    return key


def _message_time(meta: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """(wall ns, logical, which field gave them): ``updated``, else ``mvcc_timestamp``, else
    none (the message has no time)."""
    for name in ("updated", "mvcc_timestamp"):
        if meta.get(name) is not None:
            wall, logical = parse_hlc(meta[name])
            return wall, logical, name
    return None, None, "none"


def _decode_values(text: str) -> list[Any]:
    """One JSON value, or the doc's Kafka form 'KEY VALUE' (two values on one line)."""
    try:
        first, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as e:
        raise MessageError(
            f"not JSON ({e.msg}, column {e.colno}); a truncated line or not a changefeed file"
        ) from e
    rest = text[end:].strip()
    if not rest:
        return [first]
    try:
        second, end2 = _DECODER.raw_decode(rest)
    except json.JSONDecodeError as e:
        raise MessageError(
            f"not JSON after the first value ({e.msg}); a truncated line?"
        ) from e
    if rest[end2:].strip():
        raise MessageError("unknown envelope: more than a key and a value on one line")
    return [first, second]


def _reject_other_formats(value: dict[str, Any]) -> None:
    if "uuid" in value and ("source_metadata" in value or "read_method" in value):
        raise MessageError(
            "this is a Datastream event, not a CockroachDB changefeed message "
            "(use --format datastream)"
        )
    if (
        any(k in value for k in ("dataChange", "data_change", "closeStream", "close_stream"))
        or ("response" in value and "partition" in value)
        or set(value) == {"heartbeat"}
    ):
        raise MessageError(
            "this is a Bigtable change stream record, not a CockroachDB changefeed message "
            "(use --format bigtable)"
        )
    if any(k in value for k in ("data_change_record", "heartbeat_record",
                                "child_partitions_record")):
        raise MessageError(
            "this is a Spanner recording line, not a CockroachDB changefeed message "
            "(use --format recording)"
        )
