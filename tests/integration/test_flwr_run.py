"""`flwr run .` as docs/usage.md documents it: the same apps, config through --run-config."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from fedsys import metrics
from fedsys_launch.process.supervision import alive

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_flwr_run_dot_uses_the_fedsys_apps_and_run_config(tmp_path, flwr_local):
    out = tmp_path / "runs"
    rc = (f"output-dir='{out}' name='flwr' strategy='fedavg' dataset='synthetic' model='mlp' "
          "num-clients=3 clients-per-round=3 num-server-rounds=2 partition='iid'")
    try:
        proc = subprocess.run(
            ["flwr", "run", str(ROOT), "--stream", "--federation-config", "num-supernodes=3",
             "--run-config", rc],
            cwd=flwr_local.home, env=flwr_local.env, capture_output=True, text=True,
            timeout=300, check=False)
    finally:  # the local SuperLink is a detached daemon: stop it by PID
        daemons = flwr_local.stop()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = metrics.read_jsonl(out / "flwr" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    # the clients read the same run config (synthetic data, MLP): all three updates accepted
    assert all(r["clients-ok"] == 3 for r in recs[1:])
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]
    end = time.monotonic() + 15
    while time.monotonic() < end and any(alive(p) for p in daemons):
        time.sleep(0.2)
    assert not [p for p in daemons if alive(p)], "local SuperLink still running"
