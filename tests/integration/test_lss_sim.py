"""LSS is a trainer choice: it runs under every server strategy (FedAvg, FedProx's server
side, FedAdam, FedYogi, FedCDA, FedCross, FedAvg+IMA) in Flower's simulation engine, two
rounds each, through ``fedsys run`` with ``trainer=lss`` on every variant."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsys import metrics

pytestmark = pytest.mark.slow
PAIRS = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedcda", "fedcross", "ima"]


def test_lss_runs_under_every_server_strategy(tmp_path):
    strategies = ",".join(f"{s}[trainer=lss{';ima.start-round=1;ima.window=2' if s == 'ima' else ''}"
                          f"{';fedcda.warmup=1' if s == 'fedcda' else ''}]" for s in PAIRS)
    sets = {"dataset": "synthetic", "model": "mlp", "partition": "dirichlet", "num-clients": 3,
            "clients-per-round": 3, "num-server-rounds": 2, "seed": 2, "lr": 0.003,
            "local-epochs": 1, "lss.ingredients": 2, "lss.affinity": 0.1, "lss.diversity": 0.1,
            "strategy": strategies, "output-dir": tmp_path, "name": "pairs",
            "fedcda.batches": 1, "fedcda.memory": 2}
    run = subprocess.run([sys.executable, "-m", "fedsys_launch", "run",
                          *[f"--set={k}={v}" for k, v in sets.items()]],
                         capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    dirs = sorted(p.name for p in (tmp_path / "pairs").iterdir() if p.is_dir())
    assert len(dirs) == len(PAIRS), dirs
    for d in dirs:
        recs = metrics.read_jsonl(tmp_path / "pairs" / d / "metrics.jsonl")
        assert [r["round"] for r in recs] == [0, 1, 2], d
        assert all(r["clients-ok"] == 3 and r["clients-rejected"] == 0 for r in recs[1:]), d
        assert recs[-1]["accuracy"] > recs[0]["accuracy"], d
    assert "trainer=lss" in out and "rejected reply" not in out
