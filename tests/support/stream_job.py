"""A user's streaming job: ``spanner_change_stream`` into Parquet files with a checkpoint,
until the stream's ``end`` has been read. Run as ``python -m tests.support.stream_job HOST
STREAM START END OUT CHECKPOINT``. Each committed micro-batch leaves a file in the
checkpoint's ``commits/`` folder (Spark's own)."""

from __future__ import annotations

import sys

from spark_backend.spark.datasource import SpannerChangeStreamDataSource
from spark_backend.spark.session import spark_session


def main(host: str, stream: str, start: str, end: str, out: str, checkpoint: str) -> None:
    spark = spark_session()
    spark.dataSource.register(SpannerChangeStreamDataSource)
    records = (spark.readStream.format("spanner_change_stream")
               .option("project", "demo-project").option("instance", "demo-instance")
               .option("database", "demo-db").option("host", host).option("stream", stream)
               .option("start", start).option("end", end).option("max_batch_seconds", "600")
               .load())
    query = (records.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).start())
    query.processAllAvailable()  # every batch up to ``end`` (latestOffset stops there)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
