"""An interrupted test run stops what its fixtures started (``tests/conftest.py``:
SIGTERM ends a test process as Ctrl-C does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is not running
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_sigterm_to_pytest_tears_the_fixtures_down(tmp_path):
    pidfile = tmp_path / "component.pid"
    env = {**os.environ, "FEDSYS_SIGNAL_PIDFILE": str(pidfile)}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/integration/sigterm_child.py"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 120
        while not pidfile.exists() and run.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert pidfile.exists(), run.communicate(timeout=30)[0].decode()[-2000:]
        pid = int(pidfile.read_text())
        assert _alive(pid)
        run.send_signal(signal.SIGTERM)
        out = run.communicate(timeout=60)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0 and "KeyboardInterrupt" in out, out[-2000:]
    assert not _alive(pid), f"the fixture's process {pid} outlived the interrupted run"
