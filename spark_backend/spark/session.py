"""The Spark session: local by default, any master or a Spark Connect endpoint on request."""

from __future__ import annotations

import os
import threading

from spark_backend.model import config

_lock = threading.Lock()
_registered: set[int] = set()


def spark_session(master: str | None = None, remote: str | None = None):
    """Get (or create) the session and register the project's data sources once.

    ``remote`` (or env SPARK_REMOTE) selects Spark Connect (``sc://host:15002``); otherwise
    ``master`` (or env CSI_SPARK_MASTER), default ``local[*]``, bound to 127.0.0.1.
    """
    config.quiet_local_client_env()
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get(config.SPARK_REMOTE_ENVVAR)
    with _lock:
        if remote:
            spark = SparkSession.builder.remote(remote).getOrCreate()
        else:
            master = master or os.environ.get(config.SPARK_MASTER_ENVVAR) or "local[*]"
            spark = (
                SparkSession.builder.master(master)
                .appName("changestream-inspector")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "4")
                .config("spark.python.worker.reuse", "true")
                .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                .config("spark.driver.memory", "2g")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
        if id(spark) not in _registered:
            from spark_backend.spark.datasource import (
                ChangeFilesDataSource,
                SpannerChangeStreamDataSource,
            )

            spark.dataSource.register(SpannerChangeStreamDataSource)
            spark.dataSource.register(ChangeFilesDataSource)
            _registered.add(id(spark))
    return spark


_warm: set[int] = set()


def warm_up(spark) -> None:
    """Start the Python workers and import the reader in them once per session.

    The first Spark job of a session pays for starting workers and importing the Spanner
    client (seconds); paying it here, e.g. while a dashboard starts, keeps it out of a pull.
    """
    if is_remote(spark) or id(spark) in _warm:
        return
    slots = max(1, int(spark.sparkContext.defaultParallelism))

    def load(rows):
        import google.cloud.spanner  # noqa: F401
        import pyarrow  # noqa: F401

        import spark_backend.spanner.workflow  # noqa: F401

        yield sum(1 for _ in rows)

    spark.sparkContext.parallelize(range(slots), slots).mapPartitions(load).collect()
    _warm.add(id(spark))


def is_remote(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
