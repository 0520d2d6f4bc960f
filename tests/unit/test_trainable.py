"""``trainable: head`` (every trainer): only the classifier head trains, as the LSS official
code ran every method (its ``main.py``: "tmp: freezing backbone"); ``all`` trains every
parameter."""

from __future__ import annotations

import pytest
import torch

from clients import TRAINERS, LocalConfig, TrainJob
from clients.base import run_trainer
from fedsys.data import make_synthetic
from fedsys.models import build_model
from fedsys.pretrain import head_name


def _fit(name: str, trainable: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                                            torch.nn.Module]:
    ds = make_synthetic(n_train=200, n_test=10)
    net = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    trainer = TRAINERS[name]
    cfg = LocalConfig(epochs=1, batch_size=32, lr=0.05, seed=3, trainable=trainable)
    opts = trainer.Options()
    if name == "lss":
        opts = trainer.Options(ingredients=2, affinity=0.1, diversity=0.1)
    run_trainer(trainer(), TrainJob(net, ds.x_train, ds.y_train, ds.normalise, cfg, opts))
    return before, {k: v.clone() for k, v in net.state_dict().items()}, net


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_head_trains_only_the_classifier_and_all_trains_everything(name):
    before, after, net = _fit(name, "head")
    head = head_name(before) + "."
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(head) for k in moved), (head, sorted(moved))
    assert all(p.requires_grad for p in net.parameters())  # unfrozen again afterwards
    before, after, _ = _fit(name, "all")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(not k.startswith(head) for k in moved), sorted(moved)


def test_an_unknown_trainable_is_refused_by_name():
    ds = make_synthetic(n_train=20, n_test=5)
    net = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    cfg = LocalConfig(trainable="backbone")
    with pytest.raises(ValueError, match="trainable 'backbone'; allowed: all, head"):
        run_trainer(TRAINERS["sgd"](), TrainJob(net, ds.x_train, ds.y_train, ds.normalise, cfg,
                                                TRAINERS["sgd"].Options()))
