"""Which kind of session a ``SparkSession`` is: no pyspark imported, no session started."""

from __future__ import annotations


def is_remote(spark) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``), False for a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
