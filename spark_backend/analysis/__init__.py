"""Analysis: plain functions over the cache (a DuckDB connection and a stream name).

Pure SQL; every value is a bound parameter. Timestamps come back as integer nanoseconds
(``*_ns``) so callers format them with full precision.
"""

from spark_backend.analysis.dag import edges, key_range_moves, partition_detail, partitions
from spark_backend.analysis.report import anomalies, build_report, summary
from spark_backend.analysis.transactions import (
    duplicates,
    history,
    transaction_records,
    transactions,
)
from spark_backend.analysis.watermarks import (
    heartbeat_gaps,
    holding_back,
    low_watermark,
    watermark_series,
)

__all__ = [
    "anomalies",
    "build_report",
    "duplicates",
    "edges",
    "heartbeat_gaps",
    "history",
    "holding_back",
    "key_range_moves",
    "low_watermark",
    "partition_detail",
    "partitions",
    "summary",
    "transaction_records",
    "transactions",
    "watermark_series",
]
