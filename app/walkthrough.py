"""The guided walkthrough over the demo world: a split, a merge, a transaction across
partitions, the stall holding the watermark back. Steps are found in the cache, not hard-coded,
so they follow whatever the demo world (or any stream) holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .formatting import clock, duration, short
from .safe import md


@dataclass(frozen=True)
class Step:
    title: str
    text: str
    page: str                      # a name of app.nav.PAGES
    partition: str | None = None   # selected (and named in the URL)
    highlight: tuple[str, ...] = field(default_factory=tuple)
    txn: str | None = None
    at_ns: int | None = None       # the watermark replay's moment


def steps(parts: pd.DataFrame, edges: pd.DataFrame, txns: pd.DataFrame,
          stall: dict | None) -> list[Step]:
    out = [Step("The stream at a glance",
                "The overview: the range cached, partitions live and finished, records, "
                "transactions, the low watermark and what looks wrong. Each tile links to the "
                "page that explains it.", "overview")]
    splits = edges[edges["kind"] == "split"].groupby("parent")["child"].apply(list)
    if not splits.empty:
        parent = max(splits.index, key=lambda p: (len(splits[p]), p))
        kids = tuple(sorted(splits[parent]))
        out.append(Step(
            "A split", f"Partition {md(short(parent, 20))} split into {len(kids)} children "
            f"({md(', '.join(short(k) for k in kids))}): blue edges leave the end of its bar "
            "(outlined in yellow with its children).",
            "dag", parent, (parent, *kids)))
    merges = edges[edges["kind"] == "merge"].groupby("child")["parent"].apply(list)
    if not merges.empty:
        child = max(merges.index, key=lambda c: (len(merges[c]), c))
        parents = tuple(sorted(merges[child]))
        out.append(Step(
            "A merge", f"Partition {md(short(child, 20))} merges {len(parents)} parents "
            f"({md(', '.join(short(p) for p in parents))}): purple edges join their ends to its "
            "start; it is read once all of them finished.",
            "dag", child, (child, *parents)))
    multi = txns[txns["partitions_seen"] > 1] if not txns.empty else txns
    if not multi.empty:
        t = multi.sort_values(["partitions_seen", "records_seen", "server_transaction_id"],
                              ascending=[False, False, True]).iloc[0]
        out.append(Step(
            "A transaction across partitions",
            f"Transaction {md(t.server_transaction_id)} wrote {int(t.records_seen)} records in "
            f"{int(t.partitions_seen)} partitions; its records are read in order of "
            "(commit_timestamp, record_sequence).",
            "transactions", txn=str(t.server_transaction_id),
            highlight=tuple(t.partitions)))
    if stall is not None:
        out.append(Step(
            "The stall holding the watermark back",
            f"From {clock(stall['since_ns'])} partition {md(short(stall['partition'], 20))} "
            f"sent nothing, not even a heartbeat, for up to {duration(stall['max_lag_s'])}: "
            "every consumer waiting on the low watermark waited for it (the red line on the "
            "lag chart).", "watermarks", stall["partition"], (stall["partition"],),
            at_ns=int(stall["last_ns"])))
    return out
