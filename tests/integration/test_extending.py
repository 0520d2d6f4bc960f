"""docs/extending.md, proven: a strategy and a trainer defined in a test module
(``extending_example.py``), each with one option of its own and registered with one
line, run in the real simulation engine through ``fedsys run``, keep trainer state from
round to round, are killed and resumed bit-identically, and no fedsys file is edited.

The run names that module in the ``plugins`` key, so the ServerApp and every ClientApp
(in Ray worker processes) import it and its two registration lines run there too.
"""

from __future__ import annotations

import pytest
import torch

from fedsys import metrics

pytestmark = pytest.mark.slow


SETS = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "num-clients": 3,
        "clients-per-round": 3, "num-server-rounds": 6, "seed": 4, "local-epochs": 1,
        "strategy": "damped", "damped.keep": 0.5, "counting.max-batches": 2,
        "plugins": "extending_example"}


def test_a_plugin_strategy_and_trainer_run_keep_state_and_resume_bit_identically(
        tmp_path, fedsys_cli):
    sets = [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp_path}.items()]
    fedsys_cli.finish(fedsys_cli.start("run", *sets, "--set=name=ref"))
    recs = metrics.read_jsonl(tmp_path / "ref" / "damped" / "metrics.jsonl")
    assert [r["round"] for r in recs] == list(range(7))
    # the trainer's state lasted from round to round on each node: every node has seen
    # every round (all 3 are sampled each round)
    assert [(r["rounds-seen-min"], r["rounds-seen-max"]) for r in recs[1:]] == [
        (r, r) for r in range(1, 7)]
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]

    victim = fedsys_cli.start("run", *sets, "--set=name=victim")
    held = fedsys_cli.kill_after(victim, tmp_path / "victim" / "damped" / "checkpoint.pt", 2)
    assert 2 <= held < 6, "the kill must land mid-run"
    fedsys_cli.finish(fedsys_cli.start("resume", str(tmp_path / "victim")))

    a = torch.load(tmp_path / "ref" / "damped" / "model.pt")
    b = torch.load(tmp_path / "victim" / "damped" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rb = metrics.read_jsonl(tmp_path / "victim" / "damped" / "metrics.jsonl")
    assert [r["accuracy"] for r in recs] == [r["accuracy"] for r in rb]
    assert [r["loss"] for r in recs] == [r["loss"] for r in rb]
