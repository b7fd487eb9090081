"""Shared fixtures: environment for local endpoints, a real local Spark session, the emulator.

Tiers: ``pytest`` runs every test; ``pytest -m "not slow"`` leaves out the tests that start a JVM
(Spark), the Cloud Spanner emulator or a browser. Such a test must say so with
``@pytest.mark.slow`` (or a module's ``pytestmark``). In the fast tier,
:mod:`tests.support.tier_guard` fails an unmarked test that asks for the ``spark`` or
``emulator_binary`` fixture or starts java, the emulator or chromium, so a mis-marked test
cannot slip into it unnoticed.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.support import tier_guard

# Local endpoints: no metrics export (or every process waits 30 s to exit), Spark on loopback.
os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.pop("SPANNER_EMULATOR_HOST", None)


def pytest_configure(config):
    tier_guard.configure(config)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test not marked slow runs with the tripwires set (its fixtures' setup included)."""
    if not tier_guard.guards(item):
        return (yield)
    with tier_guard.tripwires(item):
        return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    tier_guard.check_fixtures(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test not marked slow that started a JVM, the emulator or a browser fails, naming it."""
    report = yield
    tier_guard.fail_report_if_tripped(item, report)
    return report


@pytest.fixture(scope="session")
def spark():
    """The project's own Spark session (local[*], 127.0.0.1), data sources registered; one per
    test process, shared by every module (a test asking for it must be marked slow)."""
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
def landed_caches(tmp_path_factory):
    """Demo worlds landed without Spark once per session; ``landed_caches.copy(dest, seed,
    scale)`` gives a module a cache file of its own (see tests/support/demo_cache.py)."""
    from tests.support.demo_cache import LandedCaches

    return LandedCaches(tmp_path_factory.mktemp("landed"))


@pytest.fixture(scope="session")
def emulator_binary() -> str:
    return require_emulator()


@pytest.fixture(autouse=True, scope="session")
def _installed_components_scanned_once():
    """Each new ``AppTest`` scans every installed package's metadata for Streamlit components
    (``manifest_scanner.scan_component_manifests``, ~0.25 s of the ~0.5 s a page run takes
    here). The installed packages do not change during a run: the scan runs once, and every
    ``AppTest`` gets what it found."""
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    found = scan()
    manifest_scanner.scan_component_manifests = lambda max_workers=None: list(found)
    yield
    manifest_scanner.scan_component_manifests = scan


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium (``tests/support/chromium.py``), one per test module."""
    from playwright.sync_api import sync_playwright

    from tests.support.chromium import CHROMIUM, CHROMIUM_ARGS, SHOTS

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
