"""fedsys runs on its in-process engine (``engine: inprocess``, ``fedsys_launch/engines/inprocess.py``):
the same numbers as Flower's simulation engine, a ClientApp that raises handled as a failed
client, and no Ray needed (synthetic data).  Resume after SIGKILL on this engine:
``test_killed_run.py``; the Grid itself: ``tests/unit/test_inprocess.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fedsys import metrics
from fedsys_launch.commands.cli import main
from fedsys_launch.config_schema import build
from fedsys_launch.engines.simulation import simulate
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
                        "clients-per-round": 2, "engine": engine, "batch-clients": False}))
    cmp = _compare_module()
    for label in ("fedavg", "fedcda", "fedcross", "fedelmy", "lss"):
        a, b = (tmp_path / e / "run" / label for e in ("flower", "inprocess"))
        diffs, values, added = cmp.compare(a / "metrics.jsonl", b / "metrics.jsonl")
        assert not diffs and not added and values > 20, (label, diffs[:5])
        assert cmp.compare_models(a / "model.pt", b / "model.pt") == [], label


@pytest.mark.slow
def test_clients_trained_together_give_the_one_at_a_time_numbers(tmp_path, caplog):
    """``batch-clients`` (the default on this engine): the round's sgd and fedprox clients
    trained together, on the FMNIST CNN with momentum and unequal (Dirichlet) client sizes,
    end where one at a time ends to float rounding (every metric of every round within
    1e-4 relative; the final models within 1e-3 of each tensor's largest weight: float32
    rounding grown over 3 rounds of momentum SGD, measured 2e-4 for FedCross's), and the
    trainers that are not batched (LSS) give the same numbers to the bit."""
    import logging

    import torch

    strategies = ("fedavg,fedprox,fedcross,fedcda[fedcda.warmup=1] as fedcda,"
                  "fedavg[trainer=lss;lss.ingredients=2] as lss")
    runs = {}
    for together in (False, True):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="flwr"):
            simulate(build({**BASE, "output-dir": str(tmp_path / str(together)), "name": "run",
                            "strategy": strategies, "num-server-rounds": 3, "model": "fmnist-cnn",
                            "dataset": "fashion-mnist", "samples-per-client": 120,
                            "test-subset": 500, "num-clients": 4, "lr": 0.01,
                            "momentum": 0.9, "partition": "dirichlet", "clients-per-round": 3,
                            "engine": "inprocess", "batch-clients": together}))
        runs[together] = [r.getMessage() for r in caplog.records
                          if "trained together" in r.getMessage()]
    assert not runs[False]
    assert any("3 clients trained together" in m for m in runs[True]), runs[True][:3]
    cmp = _compare_module()
    for label in ("fedavg", "fedprox", "fedcross", "fedcda", "lss"):
        a, b = (tmp_path / str(t) / "run" / label for t in (False, True))
        ra, rb = (metrics.read_jsonl(d / "metrics.jsonl") for d in (a, b))
        assert [r["round"] for r in ra] == [r["round"] for r in rb] == [0, 1, 2, 3]
        if label == "lss":
            diffs, values, _ = cmp.compare(a / "metrics.jsonl", b / "metrics.jsonl")
            assert not diffs and values > 20
            continue
        for x, y in zip(ra, rb, strict=True):
            assert x.keys() == y.keys(), label
            for k, v in x.items():
                if isinstance(v, float) and k not in cmp.TIMING:
                    assert v == pytest.approx(y[k], rel=1e-4, abs=1e-6), (label, x["round"], k)
        ma, mb = (torch.load(d / "model.pt", weights_only=True) for d in (a, b))
        assert ma.keys() == mb.keys()
        for k, w in ma.items():
            assert float((w - mb[k]).abs().max()) <= 1e-3 * float(w.abs().max()), (label, k)


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


#: ``fedsys`` as the command runs it, in a fresh interpreter; at exit (its hook registered
#: first, so it runs last) it prints whether Ray was imported
_RAY_AT_EXIT = """
import atexit, sys
atexit.register(lambda: print("RAY-IMPORTED=" + str("ray" in sys.modules)))
from fedsys_launch.commands.cli import main
sys.exit(main())
"""


def test_fedsys_run_in_process_needs_no_ray(tmp_path, monkeypatch, capsys):
    """A dead ``RAY_ADDRESS`` stops a Flower-engine run before it starts; the in-process
    engine does not look at it, and no Ray is imported.  The in-process run is a fresh
    process: in this one an earlier test may have imported Ray already."""
    import subprocess
    import sys

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    sets = [f"--set={k}={v}" for k, v in {**BASE, "output-dir": tmp_path, "name": "noray",
                                           "strategy": "fedavg"}.items()]
    assert main(["run", *sets]) == 2
    assert "no Ray cluster answers" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-c", _RAY_AT_EXIT, "run", *sets,
                           "--set=engine=inprocess"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("RAY-IMPORTED=")]
    assert said == ["RAY-IMPORTED=False"], (said, done.stderr[-3000:])
    recs = metrics.read_jsonl(tmp_path / "noray" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]


def test_a_flower_whose_task_identity_moved_runs_the_flower_engine(tmp_path, monkeypatch, caplog):
    """The in-process engine rests on one patch of Flower's (``task-identity``,
    fedsys_launch/flower_patches.py): where a Flower release has changed it, ``engine: inprocess``
    runs on Flower's engine instead, saying so, and gives that engine's numbers."""
    import logging

    import flwr.supercore.task_identity as module

    from fedsys_launch import flower_patches

    class Moved:  # a later Flower's, say
        pass

    monkeypatch.setattr(flower_patches, "_warned", set())
    cfg = {**BASE, "num-server-rounds": 2, "clients-per-round": 2, "strategy": "fedavg",
           "batch-clients": False}
    simulate(build({**cfg, "output-dir": str(tmp_path / "flower"), "name": "run",
                    "engine": "flower"}))
    monkeypatch.setattr(module, "TaskIdentity", Moved)
    with caplog.at_level(logging.WARNING):
        simulate(build({**cfg, "output-dir": str(tmp_path / "moved"), "name": "run",
                        "engine": "inprocess"}))
    assert "Flower patch 'task-identity' not applied" in caplog.text
    assert "this run uses engine 'flower'" in caplog.text
    cmp = _compare_module()
    a, b = (tmp_path / e / "run" / "fedavg" for e in ("flower", "moved"))
    diffs, values, added = cmp.compare(a / "metrics.jsonl", b / "metrics.jsonl")
    assert not diffs and not added and values > 10, diffs[:5]
