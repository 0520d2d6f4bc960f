"""Branching a run from a kept checkpoint (``keep-checkpoint`` / ``branch-from``), in
Flower's real simulation engine: the branch ends bit for bit where the full run ends.

This is how the IMA reproduction saves compute (spec ``fedima.md`` §5.5): FedAvg, the
"same decay, no averaging" control and FedAvg+IMA are identical until IMA's start round.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedsys import checkpoint, metrics
from fedsys.config import ConfigError
from fedsys_launch.apps.strategy_start import branch_point, kept_checkpoint
from fedsys_launch.config_schema import build, make_strategy
from fedsys_launch.engines.simulation import simulate

pytestmark = pytest.mark.slow

BASE = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "lr": 0.05, "lr-decay": 0.9,
        "num-clients": 3, "clients-per-round": 2, "num-server-rounds": 4, "seed": 11,
        "ima.start-round": 2, "ima.window": 2}
IMA = "ima[ima.base=fedavg]"
CONTROL = "ima[ima.base=fedavg;ima.average=false]"  # IMA's extra lr decay, no averaging
PLAIN = "ima[ima.base=fedavg;ima.average=false;ima.lr-decay=0.9]"  # = FedAvg


def _cfg(tmp_path: Path, **kw: object):
    return build({**BASE, "output-dir": str(tmp_path), **kw})


def _final(run: Path, label: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = torch.load(run / label / "model.pt")
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_branch_from_a_kept_checkpoint_equals_the_full_run(tmp_path):
    full = _cfg(tmp_path, name="full", strategy=f"fedavg,{IMA},{CONTROL},{PLAIN}",
                **{"keep-checkpoint": 2})
    simulate(full)
    labels = full.strategies
    run = tmp_path / "full"
    kept = kept_checkpoint(run / labels[1], 2)
    assert checkpoint.load(kept)["round"] == 2
    # IMA without averaging and with the base's own decay is FedAvg, bit for bit
    assert _same(_final(run, labels[0]), _final(run, labels[3]))
    # averaging and the extra decay act: the three IMA variants end apart
    assert not _same(_final(run, labels[1]), _final(run, labels[2]))
    assert not _same(_final(run, labels[2]), _final(run, labels[3]))

    # the control and "FedAvg" branched from the IMA run's round-2 checkpoint
    br = _cfg(tmp_path, name="branch", strategy=f"{CONTROL},{PLAIN}", **{"branch-from": str(kept)})
    simulate(br)
    for label in labels[2:]:
        assert _same(_final(run, label), _final(tmp_path / "branch", label)), label
        a = metrics.read_jsonl(run / label / "metrics.jsonl")
        b = metrics.read_jsonl(tmp_path / "branch" / label / "metrics.jsonl")
        assert [r["round"] for r in b] == [0, 1, 2, 3, 4]
        assert [r["accuracy"] for r in a] == [r["accuracy"] for r in b]
        assert {r["strategy"] for r in b} == {label}


def _branch_point(cfg):
    return branch_point(cfg, make_strategy(cfg))


def test_branch_point_refuses_a_parent_that_differs_too_early(tmp_path):
    parent = _cfg(tmp_path, strategy="ima", **{"ima.base": "fedavg"})
    path = tmp_path / "checkpoint-r0003.pt"

    def write(rnd: int, **changes: object) -> None:
        checkpoint.save(path, {"round": rnd, "strategy": {}, "config":
                               parent.replace(**changes).to_dict(), "rng": checkpoint.rng_state()})

    child = parent.replace(**{"branch-from": str(path), "ima.average": False})
    write(2)
    assert _branch_point(child)["round"] == 2  # before t_s: ima.average has not acted
    write(3)
    with pytest.raises(ConfigError, match=re.escape("ima.average: True there, False here")):
        _branch_point(child)  # round 3 > t_s = 2: averaging already changed the model
    write(2, lr=0.1)
    with pytest.raises(ConfigError, match=re.escape("lr: 0.1 there, 0.05 here")):
        _branch_point(child)
    # the engines give the same numbers one client at a time, not with clients trained
    # together
    write(2, engine="inprocess", **{"batch-clients": False})
    assert _branch_point(child)["round"] == 2
    write(2, engine="inprocess")
    with pytest.raises(ConfigError, match=re.escape(
            "(clients trained together): True there, False here")):
        _branch_point(child)
    with pytest.raises(ConfigError, match="no checkpoint at"):
        _branch_point(child.replace(**{"branch-from": str(tmp_path / "nope.pt")}))
    path.write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="is not a fedsys checkpoint"):
        _branch_point(child)
    # a method's own rule (FedsysStrategy.branch_refusal): FedCDA's disk cache, with IMA
    # over FedCDA too; the same parent with the cache in memory branches
    for strategy, extra in (("fedcda", {}), ("ima", {"ima.base": "fedcda"})):
        disk = _cfg(tmp_path, strategy=strategy, **extra, **{"fedcda.cache": "disk"})
        checkpoint.save(path, {"round": 1, "strategy": {}, "config": disk.to_dict(),
                               "rng": checkpoint.rng_state()})
        with pytest.raises(ConfigError, match="FedCDA's disk cache lives in the parent's"):
            _branch_point(disk.replace(**{"branch-from": str(path)}))
        ram = disk.replace(**{"fedcda.cache": "ram"})
        checkpoint.save(path, {"round": 1, "strategy": {}, "config": ram.to_dict(),
                               "rng": checkpoint.rng_state()})
        assert _branch_point(ram.replace(**{"branch-from": str(path)}))["round"] == 1
