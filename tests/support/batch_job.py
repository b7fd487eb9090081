"""A user's batch job: the README's ``spark.read.format("spanner_change_stream")`` in a
session of its own, its rows written to one Parquet file. Run as ``python -m
tests.support.batch_job SESSION OPTIONS OUT``: SESSION is ``sc://HOST:PORT`` (Spark Connect)
or ``MASTER@DRIVER_HOST`` (a classic driver listening on DRIVER_HOST); OPTIONS is the read's
options as JSON. ``check`` compares what the job wrote with a demo world."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from spark_backend.spark.datasource import SpannerChangeStreamDataSource


def session(spec: str) -> SparkSession:
    if spec.startswith("sc://"):
        return SparkSession.builder.remote(spec).getOrCreate()
    master, host = spec.rsplit("@", 1)
    return (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
            .config("spark.driver.host", host).config("spark.driver.bindAddress", host)
            .getOrCreate())


def main(spec: str, options: str, out: str) -> None:
    import pyarrow.parquet as pq

    spark = session(spec)
    spark.dataSource.register(SpannerChangeStreamDataSource)
    records = spark.read.format("spanner_change_stream").options(**json.loads(options)).load()
    pq.write_table(records.toArrow(), out)
    spark.stop()


def check(out, world) -> None:
    """The job's rows are every record of ``world``'s range, each once."""
    import pyarrow.parquet as pq

    from tests.test_datasource_range import records
    from tests.test_pull_demo import truth_records

    got = records(pq.read_table(out))
    assert len(got) == len(set(got)), "no record twice"
    assert set(got) == truth_records(world)


if __name__ == "__main__":
    main(*sys.argv[1:4])
