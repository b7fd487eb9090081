"""Bigtable change stream records (``--format bigtable``).

A file is JSON Lines (``.gz`` decompressed); every response is a ``google.bigtable.v2.
ReadChangeStreamResponse`` in protobuf's JSON mapping (camelCase or the proto's snake_case field
names, bytes base64, int64 as strings, timestamps RFC 3339), validated with the generated message
types of google-cloud-bigtable. A line is one of:

- a **wrapped response**, naming the partition it was read from (like the Spanner recording
  format)::

    {"partition": {"rowRange": {"startKeyClosed": "YQ==", "endKeyOpen": "bQ=="}},
     "response": {"dataChange": {...}} ,
     "table": "orders",                      # optional: the table's name
     "timestamp": "2024-05-01T10:00:05Z"}    # optional: when the response arrived

  (``partition`` is a ``StreamPartition``);
- a **bare response** ``{"dataChange": ...}`` / ``{"heartbeat": ...}`` / ``{"closeStream": ...}``.
  It belongs to the partition of the latest wrapped line or heartbeat continuation token above it
  in the file, else the ``partition`` option (a rendered range, see below), else the whole table
  ``[,)``;
- an **initial partition** as ``GenerateInitialChangeStreamPartitions`` returns it:
  ``{"partition": {"rowRange": {...}}}`` (optionally with ``timestamp``): a root of the DAG.

Partitions are row ranges rendered as stable strings: ``[start,end)`` with ``(``/``]`` for open
start / closed end keys, keys as printable ASCII with ``\\xNN`` for other bytes and for
``\\ , [ ] ( )``; ``[,)`` is the whole table. That string is the ``partition_token``. A new
partition over a range an earlier partition of the file already had (split, then merge back) is
``[start,end)#2`` (``#3``...), so the DAG stays acyclic; later lines naming that range mean the
newest one. (Generations are counted per file: keep a split/merge sequence in one file.)

Mapping to ``records.RECORD_FIELDS``:

- **DataChange** (its messages assembled: a record continues in ``CONTINUATION`` messages until
  ``done``; chunked ``SetCell`` values are joined by ``chunk_info``) -> ``kind='data_change'``:
  ``ts_ns`` = ``commit_timestamp`` (nanosecond exact); ``table_name`` = wrapper ``table``, else
  the ``table`` option; ``mod_type`` = DELETE when every mutation deletes a family or the row
  (a row deletion arrives as one ``DeleteFromFamily`` per family), else UPDATE (Bigtable writes
  cannot be told apart from inserts); ``mods`` = one mod with ``keys = {"row_key": <key text>}``,
  ``new_values`` = ``{"family:qualifier": value}`` (a deleted column: null, a deleted family
  ``family:*``: null), ``old_values`` = ``{}`` (the stream has no old values);
  ``record_id`` = ``bt|cluster|commit ns|tiebreaker|row key``; ``order_key`` = commit ns (20
  digits) | tiebreaker (+2^31, 10 digits) | cluster | row key hex: the per-row order and Bigtable's
  conflict resolution (at one timestamp the higher tiebreaker wins); ``server_transaction_id`` =
  None (no transactions); ``extra`` = type (USER | GARBAGE_COLLECTION), source_cluster_id, exact
  commit timestamp, tiebreaker, token, estimated_low_watermark, the mutations (JSON mapping),
  messages (how many responses it took).
  Its ``estimated_low_watermark`` also yields a ``heartbeat`` row (``extra.source='data_change'``).
- **Heartbeat** -> ``kind='heartbeat'``: ``ts_ns`` = ``estimated_low_watermark``, ``extra`` =
  exact text, continuation token, ``source='heartbeat'``. A watermark row is written only when the
  partition's watermark moves forward in the file: a stalled partition's repeated heartbeats and
  a redelivered record's watermark add nothing (and are not counted as duplicates).
- **CloseStream** with ``new_partitions`` -> one ``child_partitions`` row (``partition_token`` =
  the closing partition, ``child_partitions`` = each new partition with the closing partition as
  parent; a merge shows as several parents closing into the same child) and a ``partition_end``
  row (state finished, ``end`` = the close time); without new partitions: ``partition_end``
  ``open`` (status OK) or ``incomplete`` (an error status). The close time is the wrapper's
  ``timestamp``, else the partition's latest progress mark in the file, else unknown (no time:
  ``ts_ns`` None, ``extra.close_time`` = ``"unknown"``; never the epoch). Status and
  continuation tokens are kept in the partition_end ``extra``.
- an initial partition -> a ``child_partitions`` row with ``partition_token`` NULL (the virtual
  root), dated by its ``timestamp`` or else the partition's first progress mark in the file.

Bad input (never raises): not JSON, a response the message type rejects (unknown field, wrong
type), a continuation without its data change, a data change never ``done``, a heartbeat without
estimated low watermark: one ``bad`` row naming the file and line with the reason.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from typing import Any

from spark_backend.formats.lines import read_part
from spark_backend.model.records import bad_row, canonical_json, partition_end
from spark_backend.model.timestamps import TimestampError, format_ns, parse_ns

FORMAT = "bigtable"
SYSTEM = "bigtable"
WHOLE_TABLE = "[,)"
_WRAPPER_KEYS = {"partition", "response", "table", "timestamp"}
_RESPONSE_KEYS = {"dataChange", "data_change", "heartbeat", "closeStream", "close_stream"}
_ESCAPED = set(b"\\,[]()")
_DELETE_ALL = {"delete_from_family", "delete_from_row"}


class ResponseError(ValueError):
    """A line that is not a ReadChangeStreamResponse (or our wrapper around one)."""


def _types():
    """The generated protobuf classes (imported lazily: heavy for Spark workers' startup)."""
    try:
        from google.cloud.bigtable_v2.types import bigtable, data
        from google.protobuf import json_format
    except ImportError as e:  # pragma: no cover - dependency missing
        raise ImportError(
            "the bigtable format needs google-cloud-bigtable (pip install google-cloud-bigtable)"
        ) from e
    return bigtable.ReadChangeStreamResponse.pb(), data.StreamPartition.pb(), json_format


# --- rendering ---------------------------------------------------------------------------------


def render_key(key: bytes) -> str:
    out = []
    for b in key:
        if 0x21 <= b <= 0x7E and b not in _ESCAPED:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def render_partition(partition: Any) -> str:
    """A StreamPartition message -> '[start,end)'."""
    rr = partition.row_range
    start_kind = rr.WhichOneof("start_key")
    end_kind = rr.WhichOneof("end_key")
    start = getattr(rr, start_kind) if start_kind else b""
    end = getattr(rr, end_kind) if end_kind else b""
    left = "(" if start_kind == "start_key_open" else "["
    right = "]" if end_kind == "end_key_closed" else ")"
    return f"{left}{render_key(start)},{render_key(end)}{right}"


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace")


def _ts(msg: Any) -> int:
    return int(msg.seconds) * 1_000_000_000 + int(msg.nanos)


# --- the parser --------------------------------------------------------------------------------


def splittable(head: bytes) -> bool:
    """No: a bare response belongs to the partition named above it, and a data change may
    continue over several lines."""
    return False


# A large file is still read in parts, one after another, each handed the parser the part
# before it left (``formats.in_order``): the parser pickles (``Parser.__getstate__``).
IN_ORDER = True


def not_lines(stream, head: bytes, origin: str, options: dict[str, str], first: int = 1):
    if head != b"Obj\x01":
        return None
    return iter([bad_row(origin, 1, "", "an Avro file, not Bigtable change stream JSON")])


def parse_file(path: str, options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    return read_part(sys.modules[__name__], path, options)


class _Pending:
    def __init__(self, partition: str, line: int, raw: str, dc: Any, table: str | None):
        self.partition = partition
        self.line = line
        self.raw = raw
        self.dc = dc  # the first message (header fields)
        self.table = table
        self.mutations: list[dict[str, Any]] = []  # {"kind", "msg" (Mutation), "value", ...}
        self.messages = 0
        self.type_name = "TYPE_UNSPECIFIED"

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (handed on to the next part of the file): the generated messages as
        their wire bytes."""
        state = dict(self.__dict__)
        state["dc"] = self.dc.SerializeToString()
        state["mutations"] = [{**m, "msg": m["msg"].SerializeToString()} for m in self.mutations]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        change = _types()[0]().data_change
        self.dc = type(change).FromString(state["dc"])
        mutation = type(change.chunks.add().mutation)
        self.mutations = [{**m, "msg": mutation.FromString(m["msg"])} for m in state["mutations"]]


class Parser:
    """Change stream responses -> rows (``formats.lines``), one file in order."""

    def __init__(self, path: str, options: dict[str, str]):
        self.path = path
        self.options = options
        self.Response, self.Partition, self.json_format = _types()
        self.current = options.get("partition") or WHOLE_TABLE
        self.table_option = options.get("table")
        self.pending: dict[str, _Pending] = {}
        self.last_mark: dict[str, int] = {}
        self.roots: dict[str, tuple[int, str, int | None]] = {}  # token -> (line, raw, ts)
        self.last_elw: dict[str, int] = {}  # the latest watermark emitted per partition
        self.generation: dict[str, str] = {}  # row range -> the token of its latest partition
        self.closed: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        """What the next part of the file needs: everything but the generated classes."""
        state = dict(self.__dict__)
        for name in ("Response", "Partition", "json_format"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.Response, self.Partition, self.json_format = _types()

    def _resolve(self, rendered: str) -> str:
        return self.generation.get(rendered, rendered)

    def _child_token(self, rendered: str) -> str:
        """A new partition over a row range that an earlier, closed partition had (a split and
        a merge back) gets '#2', '#3'... so the DAG stays acyclic; the parents of a merge all
        name the same new token."""
        current = self._resolve(rendered)
        if current not in self.closed:
            return current
        n = 2
        while f"{rendered}#{n}" in self.closed or f"{rendered}#{n}" == current:
            n += 1
        token = f"{rendered}#{n}"
        self.generation[rendered] = token
        return token

    def _advances(self, token: str, elw: int) -> bool:
        """A watermark row only when the partition's watermark moves forward: a repeated
        estimated low watermark (a stalled partition's heartbeats, a redelivered record) adds
        nothing and must not count as a duplicate delivery."""
        prev = self.last_elw.get(token)
        if prev is not None and elw <= prev:
            return False
        self.last_elw[token] = elw
        return True

    def bad(self, number: int | None, raw: str, reason: str) -> dict[str, Any]:
        return bad_row(self.path, number, raw, reason)

    def _stamp(self, row: dict[str, Any], number: int) -> dict[str, Any]:
        row["origin"] = self.path
        row["line"] = number
        return row

    # marks: progress per partition; a pending root is emitted at its first mark
    def _mark(self, token: str, ts: int) -> Iterator[dict[str, Any]]:
        if token in self.roots:
            line, _raw, root_ts = self.roots.pop(token)
            yield self._root_row(token, line, ts if root_ts is None else root_ts)
        prev = self.last_mark.get(token)
        self.last_mark[token] = ts if prev is None else max(prev, ts)

    def _root_row(self, token: str, line: int, ts: int) -> dict[str, Any]:
        return self._stamp({
            "partition_token": None,
            "kind": "child_partitions",
            "ts_ns": ts,
            "child_partitions": canonical_json([{"token": token, "parent_partition_tokens": []}]),
        }, line)

    def line(self, number: int, text: str) -> Iterator[dict[str, Any]]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield self.bad(number, text, f"not JSON ({e.msg}, column {e.colno}); "
                                         "a truncated line or not a Bigtable JSON Lines file")
            return
        try:
            rows = list(self._line(number, text, obj))
        except ResponseError as e:
            yield self.bad(number, text, str(e))
            return
        yield from rows

    def _parse(self, value: Any, message_cls: Any, what: str) -> Any:
        try:
            return self.json_format.ParseDict(value, message_cls())
        except self.json_format.ParseError as e:
            raise ResponseError(f"not a {what}: {str(e).splitlines()[0]}") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise ResponseError(f"not a {what}: {e}") from e

    def _line(self, number: int, text: str, obj: Any) -> Iterator[dict[str, Any]]:
        if not isinstance(obj, dict):
            raise ResponseError(
                "not a Bigtable change stream line: expected a ReadChangeStreamResponse object "
                "or a {\"partition\": ..., \"response\": ...} wrapper"
            )
        arrived = None
        if "timestamp" in obj:
            try:
                arrived = parse_ns(str(obj["timestamp"]))
            except TimestampError as e:
                raise ResponseError(f"timestamp: {e}") from e
        if "response" in obj or ("partition" in obj and set(obj) <= _WRAPPER_KEYS):
            unknown = set(obj) - _WRAPPER_KEYS
            if unknown:
                raise ResponseError(
                    "unknown wrapper fields " + ", ".join(sorted(unknown))
                    + " (a wrapper has partition, response, table, timestamp)"
                )
            partition = None
            if obj.get("partition") is not None:
                partition = self._resolve(render_partition(
                    self._parse(obj["partition"], self.Partition, "StreamPartition")
                ))
            if "response" not in obj:  # an initial partition (GenerateInitial... response)
                if partition is None:
                    raise ResponseError("an initial partition line needs a partition")
                self.roots.setdefault(partition, (number, text, arrived))
                self.current = partition
                return
            if partition is not None:
                self.current = partition
            table = obj.get("table") or self.table_option
            response = obj["response"]
        else:
            if not (set(obj) & _RESPONSE_KEYS):
                raise ResponseError(_wrong_format_hint(obj))
            partition = None
            table = self.table_option
            response = obj
        if not isinstance(response, dict):
            raise ResponseError("response must be a ReadChangeStreamResponse object")
        msg = self._parse(response, self.Response, "ReadChangeStreamResponse")
        kind = msg.WhichOneof("stream_record")
        if kind == "data_change":
            yield from self._data_change(number, text, msg.data_change, partition, table)
        elif kind == "heartbeat":
            yield from self._heartbeat(number, text, msg.heartbeat, partition)
        elif kind == "close_stream":
            yield from self._close(number, msg.close_stream, partition, arrived)
        else:
            raise ResponseError("empty ReadChangeStreamResponse (no data_change, heartbeat or "
                                "close_stream)")

    # --- data changes ---------------------------------------------------------------------------

    def _data_change(self, number, text, dc, partition, table) -> Iterator[dict[str, Any]]:
        token = partition or self.current
        type_name = dc.DESCRIPTOR.fields_by_name["type_"].enum_type.values_by_number.get(
            dc.type_
        )
        type_name = type_name.name if type_name else str(dc.type_)
        pending = self.pending.get(token)
        if type_name == "CONTINUATION":
            if pending is None:
                raise ResponseError(
                    "a CONTINUATION data change without the data change it continues"
                )
        else:
            if pending is not None:
                del self.pending[token]
                yield self.bad(pending.line, pending.raw,
                               "data change never finished (no message with done=true before "
                               f"the next data change on line {number})")
            pending = _Pending(token, number, text, dc, table)
            pending.type_name = type_name
            self.pending[token] = pending
        pending.messages += 1
        try:
            self._add_chunks(pending, dc)
        except ResponseError:
            del self.pending[token]
            raise
        if dc.done:
            del self.pending[token]
            yield from self._finish_change(pending, dc)

    def _add_chunks(self, pending: _Pending, dc: Any) -> None:
        for chunk in dc.chunks:
            mutation = chunk.mutation
            mkind = mutation.WhichOneof("mutation")
            info = chunk.chunk_info if chunk.HasField("chunk_info") else None
            if info is not None and info.chunked_value_offset > 0:
                if not pending.mutations or pending.mutations[-1]["kind"] != "set_cell":
                    raise ResponseError("a value chunk without the SetCell it continues")
                last = pending.mutations[-1]
                if len(last["value"]) != info.chunked_value_offset:
                    raise ResponseError(
                        f"value chunk at offset {info.chunked_value_offset} but "
                        f"{len(last['value'])} bytes were received before it"
                    )
                last["value"] += mutation.set_cell.value
                last["last_chunk"] = info.last_chunk
                continue
            entry: dict[str, Any] = {"kind": mkind, "msg": mutation}
            if mkind == "set_cell":
                entry["value"] = bytes(mutation.set_cell.value)
                if info is not None:
                    entry["size"] = info.chunked_value_size
                    entry["last_chunk"] = info.last_chunk
            pending.mutations.append(entry)

    def _finish_change(self, p: _Pending, last: Any) -> Iterator[dict[str, Any]]:
        dc = p.dc
        for m in p.mutations:
            if "size" in m and len(m["value"]) != m["size"]:
                yield self.bad(p.line, p.raw, f"chunked value has {len(m['value'])} bytes, "
                                              f"chunk_info said {m['size']}")
                return
        if not dc.HasField("commit_timestamp"):
            yield self.bad(p.line, p.raw, "data change without commit_timestamp")
            return
        commit_ns = _ts(dc.commit_timestamp)
        row_key = bytes(dc.row_key)
        key_text = _text(row_key)
        mutations_json = []
        new_values: dict[str, Any] = {}
        for m in p.mutations:
            mj = self.json_format.MessageToDict(m["msg"], preserving_proto_field_name=True)
            kind = m["kind"]
            if kind == "set_cell":
                mj["set_cell"]["value"] = base64.b64encode(m["value"]).decode()
                cell = m["msg"].set_cell
                new_values[f"{cell.family_name}:{_text(cell.column_qualifier)}"] = _text(m["value"])
            elif kind in ("add_to_cell", "merge_to_cell"):
                cell = getattr(m["msg"], kind)
                qual = self.json_format.MessageToDict(cell.column_qualifier)
                qtext = _text(base64.b64decode(qual["rawValue"])) if "rawValue" in qual else "?"
                new_values[f"{cell.family_name}:{qtext}"] = {
                    kind: self.json_format.MessageToDict(cell.input)
                }
            elif kind == "delete_from_column":
                cell = m["msg"].delete_from_column
                new_values[f"{cell.family_name}:{_text(cell.column_qualifier)}"] = None
            elif kind == "delete_from_family":
                new_values[f"{m['msg'].delete_from_family.family_name}:*"] = None
            mutations_json.append(mj)
        kinds = {m["kind"] for m in p.mutations}
        mod_type = "DELETE" if kinds and kinds <= _DELETE_ALL else "UPDATE"
        mod = {"keys": {"row_key": key_text},
               "new_values": {} if mod_type == "DELETE" else new_values, "old_values": {}}
        elw = (_ts(last.estimated_low_watermark)
               if last.HasField("estimated_low_watermark") else None)
        cluster = dc.source_cluster_id
        tiebreaker = int(dc.tiebreaker)
        extra = {
            "system": "bigtable",
            "type": p.type_name,
            "source_cluster_id": cluster,
            "commit_timestamp": format_ns(commit_ns),
            "tiebreaker": tiebreaker,
            "token": last.token or None,
            "estimated_low_watermark": None if elw is None else format_ns(elw),
            "row_key_base64": base64.b64encode(row_key).decode(),
            "mutations": mutations_json,
            "messages": p.messages,
        }
        yield from self._mark(p.partition, commit_ns)
        yield self._stamp({
            "partition_token": p.partition,
            "kind": "data_change",
            "ts_ns": commit_ns,
            "table_name": p.table,
            "mod_type": mod_type,
            "mods": canonical_json([mod]),
            "value_capture_type": "NEW_VALUES",
            "server_transaction_id": None,
            "record_id": f"bt|{cluster}|{commit_ns}|{tiebreaker}|{extra['row_key_base64']}",
            "order_key": f"{commit_ns:020d}|{tiebreaker + 2**31:010d}|{cluster}|{row_key.hex()}",
            "extra": canonical_json(extra),
        }, p.line)
        if elw is not None and self._advances(p.partition, elw):
            yield from self._mark(p.partition, elw)
            yield self._stamp({
                "partition_token": p.partition,
                "kind": "heartbeat",
                "ts_ns": elw,
                "extra": canonical_json({
                    "system": "bigtable", "source": "data_change",
                    "estimated_low_watermark": format_ns(elw), "token": last.token or None,
                }),
            }, p.line)

    # --- heartbeats and close ---------------------------------------------------------------

    def _heartbeat(self, number, text, hb, partition) -> Iterator[dict[str, Any]]:
        token = partition
        ct = hb.continuation_token if hb.HasField("continuation_token") else None
        if token is None and ct is not None and ct.HasField("partition"):
            token = self._resolve(render_partition(ct.partition))
            self.current = token
        token = token or self.current
        if not hb.HasField("estimated_low_watermark"):
            raise ResponseError("heartbeat without estimated_low_watermark")
        elw = _ts(hb.estimated_low_watermark)
        yield from self._mark(token, elw)
        if not self._advances(token, elw):
            return
        yield self._stamp({
            "partition_token": token,
            "kind": "heartbeat",
            "ts_ns": elw,
            "extra": canonical_json({
                "system": "bigtable", "source": "heartbeat",
                "estimated_low_watermark": format_ns(elw),
                "token": (ct.token or None) if ct is not None else None,
                "continuation_partition": (
                    render_partition(ct.partition)
                    if ct is not None and ct.HasField("partition") else None
                ),
            }),
        }, number)

    def _close(self, number, cs, partition, arrived) -> Iterator[dict[str, Any]]:
        parent = partition or self.current
        status = {"code": int(cs.status.code), "message": cs.status.message or None} \
            if cs.HasField("status") else {"code": 0, "message": None}
        tokens = [
            {"partition": render_partition(t.partition) if t.HasField("partition") else None,
             "token": t.token or None}
            for t in cs.continuation_tokens
        ]
        self.closed.add(parent)
        children = [self._child_token(render_partition(p)) for p in cs.new_partitions]
        if arrived is not None:
            at, at_source = arrived, "timestamp"
        elif parent in self.last_mark:
            at, at_source = self.last_mark[parent], "last_progress_mark"
        else:  # the file carries no time for it: unknown, never the epoch
            at, at_source = None, "unknown"
        if parent in self.roots:
            yield from self._mark(parent, at)
        if children:
            yield self._stamp({
                "partition_token": parent,
                "kind": "child_partitions",
                "ts_ns": at,
                "child_partitions": canonical_json(
                    [{"token": c, "parent_partition_tokens": [parent]} for c in children]
                ),
                "extra": canonical_json({"system": "bigtable", "continuation_tokens": tokens}),
            }, number)
            end = partition_end(parent, "finished", at, end=at, status=status,
                                continuation_tokens=tokens, close_time=at_source,
                                new_partitions=children)
        elif status["code"] != 0:
            end = partition_end(parent, "incomplete", at, status=status,
                                continuation_tokens=tokens, close_time=at_source,
                                error=f"stream closed with status {status['code']}: "
                                      f"{status['message'] or ''}".strip())
        else:
            end = partition_end(parent, "open", at, status=status,
                                continuation_tokens=tokens, close_time=at_source)
        yield self._stamp(end, number)

    def finish(self) -> Iterator[dict[str, Any]]:
        for p in self.pending.values():
            yield self.bad(p.line, p.raw, "data change never finished: the file ends before "
                                          "the message with done=true (file cut short?)")
        self.pending.clear()
        fallback = min(self.last_mark.values()) if self.last_mark else None
        for token, (line, _raw, ts) in list(self.roots.items()):
            yield self._root_row(token, line, fallback if ts is None else ts)
        self.roots.clear()


def _wrong_format_hint(obj: dict[str, Any]) -> str:
    if "uuid" in obj and ("source_metadata" in obj or "read_method" in obj):
        return ("this is a Datastream event, not a Bigtable change stream record "
                "(use --format datastream)")
    if "after" in obj or "resolved" in obj or "__crdb__" in obj or "payload" in obj:
        return ("this is a CockroachDB changefeed message, not a Bigtable change stream record "
                "(use --format cockroachdb)")
    if any(k in obj for k in ("data_change_record", "heartbeat_record", "child_partitions_record")):
        return ("this is a Spanner recording line, not a Bigtable change stream record "
                "(use --format recording)")
    return ("not a Bigtable change stream record: expected dataChange, heartbeat or closeStream, "
            "or a {\"partition\": ..., \"response\": ...} wrapper")
