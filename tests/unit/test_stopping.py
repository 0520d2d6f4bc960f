"""A stop signal whose exception Python drops still stops the run
(:mod:`fedsys_launch.process.stopping`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from fedsys import metrics
from fedsys_launch.commands.cli import main
from fedsys_launch.process import stopping

#: SIGTERM lands while a finaliser runs: Python prints "Exception ignored" and goes on
#: (what once let a run train on to its last round); the round hook's check stops it
DROPPED = """
import os, signal, sys, time
from fedsys_launch.process import stopping
stopping.install()

class Slow:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass

x = Slow()
del x
print("went on", flush=True)
try:
    stopping.raise_if_stopped()
except stopping.Terminated:
    print("stopped", flush=True)
    sys.exit(143)
"""


def test_sigterm_dropped_in_a_finaliser_is_raised_again_by_the_check():
    proc = subprocess.run([sys.executable, "-c", DROPPED], capture_output=True, text=True,
                          timeout=60)
    assert "Exception ignored" in proc.stderr and "Terminated" in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == ["went on", "stopped"]
    assert proc.returncode == 143


@pytest.fixture
def received(monkeypatch):
    got: list[int] = []
    monkeypatch.setattr(stopping, "_received", got)
    return got


def test_the_check_raises_the_first_signal_in_the_main_thread_only(received):
    stopping.raise_if_stopped()  # nothing received: nothing raised
    with pytest.raises(stopping.Terminated):
        stopping.on_signal(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt) as ctrl_c:
        stopping.on_signal(signal.SIGINT, None)
    assert not isinstance(ctrl_c.value, stopping.Terminated)
    with pytest.raises(stopping.Terminated):  # the first one decides
        stopping.raise_if_stopped()
    seen: list[BaseException] = []

    def other() -> None:
        try:
            stopping.raise_if_stopped()
        except BaseException as exc:  # what it raised, if anything
            seen.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == []  # Flower's engine runs the ServerApp in a thread: its loop stops


def test_a_run_whose_stop_was_dropped_ends_after_the_round_with_143(tmp_path, received, capsys):
    """The in-process engine runs the ServerApp in the main thread: a SIGTERM recorded but
    not raised stops it at the round hook, 143 and the resume line, the round recorded."""
    received.append(signal.SIGTERM)
    t0 = time.monotonic()
    rc = main(["run", "--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=3",
               "--set", "clients-per-round=3", "--set", "strategy=fedavg", "--set",
               "num-server-rounds=500", "--set", "engine=inprocess", "--set", "checkpoint-every=1",
               "--set", f"output-dir={tmp_path}", "--set", "name=run"])
    assert rc == 143
    assert "terminated (SIGTERM); 'fedsys resume <run dir>' continues" in capsys.readouterr().err
    rows = metrics.read_jsonl(tmp_path / "run" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [0]  # stopped at the first round hook
    assert not (tmp_path / "run" / "fedavg" / "checkpoint.pt").exists()
    assert time.monotonic() - t0 < 300  # not 500 rounds
