"""`flwr run .` as the README documents it: the same apps, config through --run-config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsys import metrics
from launch.deploy import _alive, descendants, free_port
from launch.simulation import FLWR_ENV

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmd.read_bytes():
                out.append(int(cmd.parent.name))
        except OSError:
            continue
    return out


def test_flwr_run_dot_uses_the_fedsys_apps_and_run_config(tmp_path):
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(home),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = tmp_path / "runs"
    rc = (f"output-dir='{out}' name='flwr' strategy='fedavg' dataset='synthetic' model='mlp' "
          "num-clients=3 clients-per-round=3 num-server-rounds=2 partition='iid'")
    try:
        proc = subprocess.run(
            ["flwr", "run", str(ROOT), "--stream", "--federation-config", "num-supernodes=3",
             "--run-config", rc],
            cwd=home, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:  # the local SuperLink is a detached daemon: stop it by PID
        daemons = [d for p in _procs_mentioning(str(home)) for d in descendants(p)]
        for pid in daemons:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = metrics.read_jsonl(out / "flwr" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    # the clients read the same run config (synthetic data, MLP): all three updates accepted
    assert all(r["clients-ok"] == 3 for r in recs[1:])
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]
    end = time.monotonic() + 15
    while time.monotonic() < end and any(_alive(p) for p in daemons):
        time.sleep(0.2)
    assert not [p for p in daemons if _alive(p)], "local SuperLink still running"
