"""fedsys runs on its in-process engine (``engine: inprocess``, ``launch/inprocess.py``):
the same numbers as Flower's simulation engine, a ClientApp that raises handled as a failed
client, and no Ray needed (synthetic data).  Resume after SIGKILL on this engine:
``test_killed_run.py``; the Grid itself: ``tests/unit/test_inprocess.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fedsys import metrics
from launch.cli import main
from launch.registry import build
from launch.simulation import simulate
from tests.integration.test_simulation import BASE, faulty

ROOT = Path(__file__).resolve().parents[2]


def _compare_module():
    """``scripts/metrics_identical.py``, the proof a change gives, loaded by path."""
    spec = importlib.util.spec_from_file_location("metrics_identical",
                                                  ROOT / "scripts" / "metrics_identical.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_in_process_engine_gives_the_flower_engines_numbers(tmp_path):
    """Every metric of every round and every final model, bit for bit, for strategies
    whose state lives on the server (FedCDA's caches, FedCross's middleware models, a
    FedELMY chain with its pool) and a client that trains a soup (LSS)."""
    strategies = ("fedavg,fedcda[fedcda.warmup=1] as fedcda,fedcross,"
                  "fedelmy[fedelmy.pool-size=2] as fedelmy,"
                  "fedavg[trainer=lss;lss.ingredients=2] as lss")
    for engine in ("flower", "inprocess"):
        simulate(build({**BASE, "output-dir": str(tmp_path / engine), "name": "run",
                        "strategy": strategies, "num-server-rounds": 3,
                        "clients-per-round": 2, "engine": engine}))
    cmp = _compare_module()
    for label in ("fedavg", "fedcda", "fedcross", "fedelmy", "lss"):
        a, b = (tmp_path / e / "run" / label for e in ("flower", "inprocess"))
        diffs, values, added = cmp.compare(a / "metrics.jsonl", b / "metrics.jsonl")
        assert not diffs and not added and values > 20, (label, diffs[:5])
        assert cmp.compare_models(a / "model.pt", b / "model.pt") == [], label


def test_a_client_that_raises_is_a_failed_client_and_the_run_goes_on(tmp_path, caplog):
    cfg = build({**BASE, "output-dir": str(tmp_path), "name": "faulty", "strategy": "fedavg",
                 "engine": "inprocess"})
    simulate(cfg, client_app=faulty)
    recs = metrics.read_jsonl(tmp_path / "faulty" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert all(r["clients-ok"] == 2 and r["clients-rejected"] == 1 for r in recs[1:])
    assert recs[2]["accuracy"] > recs[0]["accuracy"]
    logged = [r.getMessage() for r in caplog.records]
    assert any("rejected reply of client 1" in m and "error reply (code 2)" in m
               and "injected failure" in m for m in logged)


def test_fedsys_run_in_process_needs_no_ray(tmp_path, monkeypatch, capsys):
    """A dead ``RAY_ADDRESS`` stops a Flower-engine run before it starts; the in-process
    engine does not look at it, and no Ray is imported."""
    import sys

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    sets = [f"--set={k}={v}" for k, v in {**BASE, "output-dir": tmp_path, "name": "noray",
                                           "strategy": "fedavg"}.items()]
    assert main(["run", *sets]) == 2
    assert "no Ray cluster answers" in capsys.readouterr().err
    ray_before = "ray" in sys.modules
    assert main(["run", *sets, "--set=engine=inprocess"]) == 0
    assert ray_before or "ray" not in sys.modules
    recs = metrics.read_jsonl(tmp_path / "noray" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
