"""Deployment smoke: a real SuperLink and two SuperNodes on 127.0.0.1, `flwr run`."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsys import metrics
from fedsys.deploy import LocalDeployment, _alive

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]


def test_default_app_runs_two_rounds_over_a_real_superlink(tmp_path):
    dep = LocalDeployment(tmp_path / "deploy", num_nodes=2)
    out = tmp_path / "runs"
    try:
        dep.up()
        log = dep.flwr_run(ROOT, {
            "name": "smoke", "output-dir": str(out), "strategy": "fedavg",
            "num-clients": 2, "clients-per-round": 2, "num-server-rounds": 2,
            "model": "mlp", "local-steps": 30, "partition": "iid", "test-subset": 2000,
        })
        pids = dep.all_pids()
        assert len(pids) >= 3 + 3  # SuperLink, 2 SuperNodes and their SuperExecs
    finally:
        dep.down()
    recs = metrics.read_jsonl(out / "smoke" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2], log[-2000:]
    assert all(r["clients-ok"] == 2 for r in recs[1:])
    assert recs[-1]["accuracy"] > 0.5 > recs[0]["accuracy"]  # Fashion-MNIST, learned something
    assert not [p for p in pids if _alive(p)], "processes left running after down()"
