"""The command line's ``main`` run in the test's own process, for tables of cases that would
otherwise start an interpreter each (about 0.3 s of CPU per case). Tests of the process
boundary itself (exit codes of ``python -m``, signals, what a crash leaves) start real
processes instead."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

from spark_backend import cli as command_line


def cli_here(*argv: str, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """What ``python -m spark_backend *argv`` run in ``cwd`` gives (its exit code, stdout and
    stderr), with ``CSI_CACHE`` unset; the environment and the working folder are restored
    after."""
    out, err = io.StringIO(), io.StringIO()
    environ, here = dict(os.environ), os.getcwd()
    os.environ.pop("CSI_CACHE", None)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = command_line.main(list(argv))
            except SystemExit as stop:  # the parser's own refusals
                code = stop.code
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())
