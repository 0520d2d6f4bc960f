"""Deployment smoke through the CLI: `fedsys deploy up / run / status / down` on
127.0.0.1 (insecure, two SuperNodes), two rounds of FedAvg on Fashion-MNIST."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsys import metrics
from launch.deploy import LocalDeployment, _alive
from launch.simulation import FLWR_ENV

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]


def fedsys_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **FLWR_ENV}
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_deploy_cli_up_run_status_down(tmp_path: Path) -> None:
    d = str(tmp_path / "deploy")
    out = tmp_path / "runs"
    cfg = tmp_path / "smoke.yaml"
    cfg.write_text(
        f"name: smoke\noutput-dir: {out}\nstrategy: fedavg\nnum-clients: 2\n"
        "clients-per-round: 2\nnum-server-rounds: 2\nmodel: mlp\nlocal-steps: 30\n"
        "partition: iid\ntest-subset: 2000\n")
    pids: list[int] = []
    try:
        up = fedsys_cli("deploy", "up", "--nodes", "2", "--dir", d)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "insecure" in up.stdout and "2 SuperNodes" in up.stdout
        again = fedsys_cli("deploy", "up", "--dir", d)
        assert again.returncode == 2 and "a deployment is running" in again.stderr
        pids = LocalDeployment.load(Path(d)).all_pids()
        assert len(pids) >= 6  # SuperLink, server SuperExec, 2 SuperNodes, 2 SuperExecs
        run = fedsys_cli("deploy", "run", str(cfg), "--dir", d)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "final acc %" in run.stdout and "fedavg" in run.stdout  # the results table
        status = fedsys_cli("deploy", "status", "--dir", d)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("running") >= 6 and "online" in status.stdout
        assert "finished:completed" in status.stdout.replace("\n", "")  # flwr ls
    finally:
        down = fedsys_cli("deploy", "down", "--dir", d)
    assert down.returncode == 0 and "nothing of" in down.stdout, down.stdout + down.stderr
    assert not [p for p in pids if _alive(p)], "processes left running after down"
    recs = metrics.read_jsonl(out / "smoke" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert all(r["clients-ok"] == 2 for r in recs[1:])
    assert recs[-1]["accuracy"] > 0.5 > recs[0]["accuracy"]  # Fashion-MNIST, learned something
