"""Debian's chromium for the browser tests (never a downloaded browser): where it is, how it
starts, where screenshots go (``browser``, the fixture, is in ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SHOTS = ROOT / "screenshots"

