"""What ``spanner.connect`` opened in the Spark Python workers (a test-only data source: its
tasks run in the same reused workers as the pull's)."""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class _Usage(DataSource):
    """What ``connect`` opened in the Python workers that run this read's tasks."""

    @classmethod
    def name(cls) -> str:
        return "test_connect_usage"

    def schema(self) -> str:
        return "pid long, opened long, clients long, databases long"

    def reader(self, schema) -> DataSourceReader:
        return _UsageReader()


class _UsageReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(i) for i in range(4)]

    def read(self, partition):
        from spark_backend.spanner import connect as worker_connect

        yield (os.getpid(), worker_connect.USAGE["open_database"],
               worker_connect.USAGE["clients"], len(worker_connect._DATABASES))


def worker_usage(spark) -> dict[int, tuple[int, int, int]]:
    """pid -> (open_database calls, clients made, databases kept) of the workers reached."""
    spark.dataSource.register(_Usage)
    rows = spark.read.format("test_connect_usage").load().collect()
    return {r.pid: (r.opened, r.clients, r.databases) for r in rows}
