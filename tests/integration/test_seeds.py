"""Seeds as an axis: ``fedsys run --seeds 0,1`` runs every strategy once per seed (each
its own partition, sampling and initial model) under ``runs/<name>/seed-<k>/``, writes
one table and one figure across seeds, resumes per seed bit-identically after a SIGKILL,
branches per seed, and ``fedsys compare`` reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedsys import metrics
from fedsys_launch.commands.results import load_seeded

pytestmark = pytest.mark.slow
SETS = {"dataset": "synthetic", "model": "mlp", "partition": "dirichlet", "num-clients": 3,
        "clients-per-round": 2, "num-server-rounds": 4, "local-epochs": 1, "lr": 0.05,
        "strategy": "fedavg,fedprox", "keep-checkpoint": 2}


def _sets(tmp: Path, name: str, **extra: object) -> list[str]:
    return [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp, "name": name, **extra}.items()]


def _models(run: Path, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    return {s: torch.load(run / f"seed-{seed}" / s / "model.pt") for s in ("fedavg", "fedprox")}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_seeds_run_resume_branch_and_compare(tmp_path, fedsys_cli):
    out = fedsys_cli.finish(fedsys_cli.start("run", *_sets(tmp_path, "ref"), "--seeds", "0,1"))
    run = tmp_path / "ref"
    for k in (0, 1):
        cfg = (run / f"seed-{k}" / "config.yaml").read_text()
        assert f"seed: {k}\n" in cfg and "seeds: ''" in cfg
    assert "seeds: 0,1" in (run / "config.yaml").read_text()
    # each seed its own partition, sampling and initial model: different numbers
    r0 = metrics.read_jsonl(run / "seed-0" / "fedavg" / "metrics.jsonl")
    r1 = metrics.read_jsonl(run / "seed-1" / "fedavg" / "metrics.jsonl")
    assert r0[0]["accuracy"] != r1[0]["accuracy"]
    table = (run / "results.md").read_text()
    assert "| fedavg | 2 | 4 |" in table and "±" in table and (run / "accuracy.png").exists()
    assert "seeds [0, 1]" in out or "seeds [0, 1]" in table
    seeded = load_seeded(run)
    assert sorted(seeded) == ["fedavg", "fedprox"] and sorted(seeded["fedavg"]) == [0, 1]

    # killed during seed 1, resumed from the parent directory: bit-identical to ref
    victim = fedsys_cli.start("run", *_sets(tmp_path, "victim"), "--seeds", "0,1")
    fedsys_cli.kill_after(victim, tmp_path / "victim" / "seed-1" / "fedavg" / "checkpoint.pt", 1)
    assert not (tmp_path / "victim" / "seed-1" / "fedprox" / "model.pt").exists()
    fedsys_cli.finish(fedsys_cli.start("resume", str(tmp_path / "victim")))
    for k in (0, 1):
        a, b = _models(run, k), _models(tmp_path / "victim", k)
        assert all(_same(a[s], b[s]) for s in a), k
    assert (tmp_path / "victim" / "results.md").exists()

    # a branch per seed from each seed's kept round-2 checkpoint ends where ref ended
    fedsys_cli.finish(fedsys_cli.start("run", *_sets(
        tmp_path, "branch", strategy="fedavg",
        **{"branch-from": f"{run}/seed-{{seed}}/fedavg/checkpoint-r0002.pt"}), "--seeds", "0,1"))
    for k in (0, 1):
        b = torch.load(tmp_path / "branch" / f"seed-{k}" / "fedavg" / "model.pt")
        assert _same(_models(run, k)["fedavg"], b), k
        recs = metrics.read_jsonl(tmp_path / "branch" / f"seed-{k}" / "fedavg" / "metrics.jsonl")
        assert [r["round"] for r in recs] == [0, 1, 2, 3, 4]

    cmp = subprocess.run([sys.executable, "-m", "fedsys_launch", "compare", str(run),
                          str(tmp_path / "branch"), "--out", str(tmp_path / "c.png")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert "ref/fedavg" in cmp.stdout and "branch/fedavg" in cmp.stdout and "±" in cmp.stdout
