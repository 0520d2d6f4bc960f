"""Ctrl-C stops ``fedsys resume`` mid-run: a terminal sends SIGINT to the whole
foreground process group (here the command and its children; the suite's Ray cluster is
outside it, a user's own cluster inside: both ways were checked by hand, 2026-11-27); the
command exits
130 saying how to continue, the checkpoint it leaves is whole, and ``fedsys resume`` then
finishes the run.  (``fedsys run`` takes the same path: ``resume`` is ``run`` on the saved
config.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fedsys import checkpoint

pytestmark = pytest.mark.slow
SETS = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "num-clients": 3,
        "clients-per-round": 3, "local-epochs": 1, "lr": 0.05, "strategy": "fedavg"}


def _sets(tmp: Path, **extra: object) -> list[str]:
    return [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp, "name": "run",
                                          **extra}.items()]


def _round(ckpt: Path) -> int:
    try:
        return int(checkpoint.load(ckpt)["round"]) if ckpt.exists() else 0
    except checkpoint.CheckpointError:
        return 0  # mid-write


def _interrupt_at(proc: subprocess.Popen[bytes], ckpt: Path, rnd: int,
                  sig: int = signal.SIGINT) -> tuple[int, str]:
    """SIGINT to the command's process group (as Ctrl-C sends it) once ``ckpt`` holds round
    ``rnd``, or SIGTERM to the command alone (as ``kill PID``, ``timeout`` and ``docker stop``
    send it); its exit status and output (a command still running 120 s later fails the
    test)."""
    end = time.monotonic() + 400
    while _round(ckpt) < rnd and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # its own session: the group is the command's
    else:
        os.kill(proc.pid, sig)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, (out + err).decode(errors="replace")


@pytest.mark.parametrize("engine", ["flower", "inprocess"])
def test_ctrl_c_stops_resume_and_resume_finishes_the_run(tmp_path, fedsys_cli, engine):
    ckpt = tmp_path / "run" / "fedavg" / "checkpoint.pt"
    fedsys_cli.finish(fedsys_cli.start("run", *_sets(tmp_path, **{"num-server-rounds": 1,
                                                                   "engine": engine})))
    proc = fedsys_cli.start("resume", str(tmp_path / "run"), "--set", "num-server-rounds=500")
    rc, out = _interrupt_at(proc, ckpt, 3)
    assert rc == 130, out[-3000:]
    assert "interrupted; 'fedsys resume <run dir>' continues" in out
    held = _round(ckpt)
    assert 3 <= held < 500
    fedsys_cli.finish(fedsys_cli.start("resume", str(tmp_path / "run"),
                                       "--set", f"num-server-rounds={held + 1}"))
    assert _round(ckpt) == held + 1 and (tmp_path / "run" / "fedavg" / "model.pt").exists()


@pytest.mark.parametrize("engine", ["flower", "inprocess"])
def test_sigterm_stops_run_and_resume_finishes_it(tmp_path, fedsys_cli, engine):
    """SIGTERM to the command alone (Ray's workers do not get it): exit 143 saying how to
    continue, no stack dump from Ray's failure handler, a whole checkpoint, and ``fedsys
    resume`` finishes the run (on either engine)."""
    ckpt = tmp_path / "run" / "fedavg" / "checkpoint.pt"
    proc = fedsys_cli.start("run", *_sets(tmp_path, **{"num-server-rounds": 500,
                                                         "engine": engine}))
    rc, out = _interrupt_at(proc, ckpt, 2, signal.SIGTERM)
    assert rc == 143, out[-3000:]
    assert "terminated (SIGTERM); 'fedsys resume <run dir>' continues" in out
    assert "SIGTERM received" not in out and "logging.cc" not in out, out[-3000:]
    held = _round(ckpt)
    assert 2 <= held < 500
    fedsys_cli.finish(fedsys_cli.start("resume", str(tmp_path / "run"),
                                       "--set", f"num-server-rounds={held + 1}"))
    assert _round(ckpt) == held + 1 and (tmp_path / "run" / "fedavg" / "model.pt").exists()
