"""Product code uses only the public API of pyspark, py4j and the Google clients.

The rule, checked on the source (no JVM, no import of the code): a name is private when it
starts with ``_`` and is not a dunder (``__init__``). In every ``.py`` under ``spark_backend/``,
``app/`` and ``pages/`` it is an error

1. to import from those libraries a private module or name (``from pyspark.util import
   _create_local_socket``, ``import google.cloud.spanner_v1._helpers``);
2. to read a private attribute of a name bound by importing from those libraries
   (``SparkContext._active_spark_context``, ``pyspark.util._x``) or of anything reached from
   such a name by attribute (``pyspark.sql.SparkSession._instantiatedSession``);
3. to read, on any object but ``self`` and ``cls``, an attribute named like one of those
   libraries' private members that code reaches for (``PRIVATE_MEMBERS``: ``df._jdf``,
   ``database._instance``, ``sc._jsc``), by dot or by ``getattr`` with a constant name.

Rule 3 is what catches objects whose type the source does not name (a session, a DataFrame,
a ``Database`` passed in as arguments); our own classes' private members are read on
``self``, and our own modules' private names are not on the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("pyspark", "py4j", "google")
# Private members of pyspark, py4j and google-cloud-spanner objects that code outside them
# has been seen to reach for.
PRIVATE_MEMBERS = frozenset({
    "_jdf", "_jsc", "_jvm", "_gateway", "_jsparkSession", "_jconf", "_sc", "_jrdd", "_jseq",
    "_plan", "_session", "_active_spark_context", "_instantiatedSession", "_activeSession",
    "_instance", "_client", "_database", "_pool", "_spanner_api", "_emulator_host",
    "_client_options", "_credentials", "_channel", "_transport", "_grpc_channel",
    "_helpers", "_make_value_pb", "_parse_value_pb",
})
_EXEMPT_RECEIVERS = ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _from_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def problems_in(source: str, label: str) -> list[str]:
    """Every use of a private name of the libraries in ``source`` (see the module doc)."""
    tree = ast.parse(source, label)
    bound: set[str] = set()  # names this module binds by importing from the libraries
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _from_library(alias.name):
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{label}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if not _from_library(node.module):
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{label}:{node.lineno} imports from {node.module}")
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append(f"{label}:{node.lineno} imports {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root_name(node.value)
            if root in _EXEMPT_RECEIVERS and isinstance(node.value, ast.Name):
                continue
            if root in bound or node.attr in PRIVATE_MEMBERS:
                found.append(f"{label}:{node.lineno} reads .{node.attr} of {root or 'a value'}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            name, receiver = node.args[1].value, node.args[0]
            exempt = isinstance(receiver, ast.Name) and receiver.id in _EXEMPT_RECEIVERS
            if _private(name) and not exempt and (
                    name in PRIVATE_MEMBERS or _root_name(receiver) in bound):
                found.append(f"{label}:{node.lineno} {node.func.id}(..., {name!r})")
    return found


def _sources() -> list[Path]:
    files: list[Path] = []
    for top in ("spark_backend", "app", "pages"):
        files += sorted((ROOT / top).rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def test_product_code_touches_no_private_name_of_pyspark_py4j_or_google():
    problems = []
    for path in _sources():
        problems += problems_in(path.read_text(encoding="utf-8"),
                                str(path.relative_to(ROOT)))
    assert not problems, "private names of pyspark/py4j/google used:\n" + "\n".join(problems)


@pytest.mark.parametrize("snippet", [
    "from pyspark.util import _create_local_socket",
    "from google.cloud.spanner_v1._helpers import _make_value_pb",
    "import google.cloud.spanner_v1._helpers",
    "from pyspark import SparkContext\nactive = SparkContext._active_spark_context",
    "import pyspark.sql\nx = pyspark.sql.SparkSession._instantiatedSession",
    "def f(df):\n    return df._jdf.collectAsArrowToPython()",
    "def f(spark, df):\n    return spark.client.to_table_as_iterator(df._plan.to_proto(1), 1)",
    "def f(sc):\n    return sc._jsc.sc().statusTracker()",
    "def f(database):\n    return database._instance._client.database_admin_api",
    "def f(inst):\n    return inst._client.project",
    "def f(df):\n    return getattr(df, '_jdf')",
])
def test_the_checker_catches_each_kind_of_private_use(snippet):
    assert problems_in(snippet, "probe.py")


@pytest.mark.parametrize("snippet", [
    "from pyspark.sql import SparkSession\nspark = SparkSession.active()",
    "class C:\n    def f(self):\n        return self._client",
    "from spark_backend.model import config\nx = config._private_of_ours",
    "def f(df):\n    return df.toArrow().__class__",
])
def test_the_checker_leaves_public_and_our_own_names_alone(snippet):
    assert problems_in(snippet, "probe.py") == []
