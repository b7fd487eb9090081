"""Shared fixtures: environment for local endpoints, a real local Spark session, the emulator."""

from __future__ import annotations

import os
import sys

import pytest

# Local endpoints: no metrics export (or every process waits 30 s to exit), Spark on loopback.
os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.pop("SPANNER_EMULATOR_HOST", None)


@pytest.fixture(scope="session")
def spark():
    """The project's own Spark session (local[*], 127.0.0.1), data sources registered."""
    from spark_backend.spark.session import spark_session

    session = spark_session()
    yield session


def require_emulator() -> str:
    """The emulator binary; on CI a missing emulator fails the run, elsewhere it skips."""
    from spark_backend.model import config

    binary = config.emulator_binary()
    if binary is None:
        message = (
            "The Cloud Spanner emulator is not installed (expected at "
            f"{config.DEFAULT_EMULATOR_BINARY} or ${config.EMULATOR_BINARY_ENVVAR})."
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def emulator_binary() -> str:
    return require_emulator()
