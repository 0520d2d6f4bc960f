"""Run by ``tests/unit/test_suite_signals.py`` only (its name is not a test file's): a test
whose fixture starts a process in a session of its own, as a deployment's fixtures start
the SuperLink and SuperNodes, and stops it in its teardown."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def component() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_waits_for_a_signal(component: subprocess.Popen[bytes]) -> None:
    Path(os.environ["FEDSYS_SIGNAL_PIDFILE"]).write_text(str(component.pid))
    time.sleep(600)
