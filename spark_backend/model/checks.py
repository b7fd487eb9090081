"""Checks of user-given values, run before anything starts (Spark, servers, emulators).

Each check returns the value it accepts or raises ``BadInput`` with one sentence naming the
input, what was wrong and what is accepted.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from spark_backend.model import config
from spark_backend.model.errors import BadInput

CACHE_STREAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
# The one definition of the Spark URLs we accept (the session checks with these too).
SPARK_MASTER_RE = re.compile(
    r"^(local(\[(\*|0*[1-9]\d*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^\s/]+:\d+"
    r"(,[^\s/]+:\d+)*|yarn|k8s://\S+)$"
)
SPARK_REMOTE_RE = re.compile(
    r"^sc://(?P<host>\[[0-9a-fA-F:]+\]|[^\s:/;]+)(:(?P<port>\d+))?/?(;\S*)?$")

# Bounds of the numbers users give (flags and forms share them).
DEMO_SCALE = (0.01, 50.0)
DEMO_SEED = (0, 2**31 - 1)
EMULATOR_SECONDS = (1.0, 3600.0)
STALL_AFTER_S = (0.001, 30 * 86400.0)


def number(value: Any, label: str, low: float, high: float, unit: str = "",
           field: str | None = None) -> float:
    """A finite number in ``[low, high]``."""
    shown = f"{label} {value!r}"
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or not low <= x <= high:
        raise BadInput(f"{shown} is not accepted; use a number from {low:g} to {high:g}"
                       f"{' ' + unit if unit else ''}.", field=field)
    return x


def integer(value: Any, label: str, low: int, high: int, field: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadInput(f"{label} {value!r} is not accepted; use a whole number from {low} to "
                       f"{high}.", field=field)
    return value


def cache_stream_name(name: Any, label: str = "--as") -> str:
    if not isinstance(name, str) or not CACHE_STREAM_NAME.match(name):
        raise BadInput(
            f"{label} {name!r} is not a valid stream name; use letters, digits, '_', '.', '-' "
            "(starting with a letter or '_', at most 128 characters).", field="stream",
        )
    return name


def spark_master(value: str | None, label: str = "--spark-master") -> str | None:
    """``label``: where the value came from (the flag, or ``$CSI_SPARK_MASTER``)."""
    if value is not None and not SPARK_MASTER_RE.match(value):
        raise BadInput(
            f"{label} {value!r} is not a Spark master URL; accepted are local[*], "
            "local[N] (N >= 1), spark://HOST:PORT, yarn and k8s://https://HOST:PORT.",
            field="spark_master",
        )
    return value


_TOKEN = re.compile(r"(;\s*token=)[^;]*", re.IGNORECASE)


def shown_remote(value: str) -> str:
    """A Spark Connect URL as messages show it: its ``;token=`` (a credential) left out."""
    return _TOKEN.sub(r"\1(hidden)", value)


def spark_remote(value: str | None, label: str = "--spark-remote") -> str | None:
    """``label``: where the value came from (the flag, or ``$SPARK_REMOTE``)."""
    if value is not None and not SPARK_REMOTE_RE.match(value):
        raise BadInput(
            f"{label} {shown_remote(value)!r} is not a Spark Connect URL; accepted is "
            "sc://HOST[:PORT] (default port 15002).", field="spark_remote",
        )
    return value


_SPARK_KEY = re.compile(r"spark\.[A-Za-z0-9_.\-]+")


def spark_conf(value: str | None, remote: bool = False) -> dict[str, str]:
    """``$CSI_SPARK_CONF``: ``KEY=VALUE`` entries (keys ``spark.*``) separated by ``;`` or new
    lines; they go to a classic session only (a Connect server has its own settings)."""
    label = f"${config.SPARK_CONF_ENVVAR}"
    comma = re.search(r",\s*(spark\.[A-Za-z0-9_.\-]+=)", value or "")
    if comma:  # a value may hold commas (a list of files); a comma before a key is a mistake
        raise BadInput(f"{label}: entries are separated by ';' or new lines, not ',' (before "
                       f"{comma.group(1)!r}); e.g. spark.executor.memory=4g;spark.yarn.queue=etl.")
    settings: dict[str, str] = {}
    for entry in re.split(r"[;\n]", value or ""):
        if not entry.strip():
            continue
        key, eq, setting = entry.strip().partition("=")
        key = key.strip()
        if not eq or not _SPARK_KEY.fullmatch(key) or not setting.strip():
            raise BadInput(f"{label} {entry.strip()!r} is not a Spark setting; give KEY=VALUE "
                           "entries with keys spark.*, separated by ';' (e.g. "
                           "spark.executor.memory=4g;spark.submit.pyFiles=/opt/csi.zip).")
        settings[key] = setting.strip()
    if settings and remote:
        raise BadInput(f"{label} applies to a classic Spark session; a Spark Connect server has "
                       "its own settings: give them when you start it (or unset "
                       f"{label}).")
    return settings


def spark_choice(master: str | None, remote: str | None) -> None:
    """The Spark a job will use: the flags, and the environment variables it falls back on
    (``session.spark_session``), each named as given."""
    spark_master(master)
    spark_remote(remote)
    if master or remote:
        spark_conf(os.environ.get(config.SPARK_CONF_ENVVAR), remote=bool(remote))
        return
    if os.environ.get(config.SPARK_REMOTE_ENVVAR):
        spark_remote(os.environ[config.SPARK_REMOTE_ENVVAR], f"${config.SPARK_REMOTE_ENVVAR}")
        spark_conf(os.environ.get(config.SPARK_CONF_ENVVAR), remote=True)
    else:
        spark_master(os.environ.get(config.SPARK_MASTER_ENVVAR) or None,
                     f"${config.SPARK_MASTER_ENVVAR}")
        spark_conf(os.environ.get(config.SPARK_CONF_ENVVAR))
