"""Pre-trained starts: the held-out split no client sees, the head reset, the saved
provenance, and ``init-from`` (a fitting model loads; anything else is one clear error)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsys import pretrain
from fedsys.config import ConfigError
from fedsys.params import from_torch
from fedsys.task import client_data, dataset, holdout, initial_params, model, partitions
from fedsys_launch.commands.pretrain import pretrain as run_pretrain
from fedsys_launch.config_schema import build

BASE = {"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 4,
        "partition": "dirichlet", "seed": 1}


def test_holdout_is_balanced_fixed_and_never_given_to_a_client():
    cfg = build({**BASE, "pretrain.holdout": 200})
    held = holdout(cfg)
    labels = np.asarray(dataset(cfg).y_train)
    assert len(held) == 200 and np.bincount(labels[held], minlength=10).tolist() == [20] * 10
    parts = partitions(cfg)
    every = np.concatenate(parts)
    assert not set(every.tolist()) & set(held.tolist())
    assert sorted(every.tolist() + held.tolist()) == list(range(len(labels)))
    for seed in (2, 3):  # the same held-out samples for every run seed
        assert np.array_equal(holdout(build({**BASE, "seed": seed, "pretrain.holdout": 200})), held)
    # without a hold-out the partitions are what they always were
    plain = partitions(build(BASE))
    assert len(np.concatenate(plain)) == len(labels)


def test_samples_per_client_subsamples_each_partition_after_the_holdout():
    cfg = build({**BASE, "pretrain.holdout": 200})
    whole = partitions(cfg)
    cap = min(len(p) for p in whole) + 5
    small = partitions(build({**BASE, "pretrain.holdout": 200, "samples-per-client": cap}))
    assert [len(p) for p in small] == [min(len(p), cap) for p in whole]
    for a, b in zip(whole, small, strict=True):
        assert set(b.tolist()) <= set(a.tolist())  # still never a held-out sample
    x, _ = client_data(build({**BASE, "samples-per-client": 7}), 0)
    assert len(x) == 7


def test_holdout_from_a_label_subset():
    cfg = build({**BASE, "pretrain.holdout": 90, "pretrain.split": "labels",
                 "pretrain.labels": "0,1,2"})
    labels = np.asarray(dataset(cfg).y_train)
    assert sorted(set(labels[holdout(cfg)].tolist())) == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"pretrain\.labels"):
        holdout(build({**BASE, "pretrain.holdout": 9, "pretrain.split": "labels",
                       "pretrain.labels": "0,12"}))
    with pytest.raises(ConfigError, match="need"):
        pretrain.holdout_indices(np.array([0, 0, 1]), 4, "balanced")


def test_pretrain_saves_a_model_with_a_fresh_head_and_its_provenance(tmp_path):
    cfg = build({**BASE, "pretrain.holdout": 300, "pretrain.epochs": 3, "pretrain.lr": 0.005,
                 "output-dir": str(tmp_path), "name": "pt"})
    out = run_pretrain(cfg)
    blob = torch.load(out, weights_only=True)
    prov = blob["provenance"]
    assert blob["format"] == pretrain.FORMAT and prov["holdout"]["samples"] == 300
    assert prov["config"]["pretrain.holdout"] == 300 and prov["head-reinitialised"] == "3"
    assert prov["test-accuracy-before-head-reset"] > 0.5
    fresh = from_torch(model(cfg).state_dict())
    assert not np.array_equal(blob["state_dict"]["1.weight"].numpy(), fresh["1.weight"])
    # a run holding out the same samples starts from it
    run = build({**BASE, "pretrain.holdout": 300, "init-from": str(out)})
    start = initial_params(run)
    assert all(np.array_equal(start[k], blob["state_dict"][k].numpy()) for k in start)
    # one that would hand the pre-training samples to its clients is refused
    with pytest.raises(ConfigError, match=r"pretrain\.holdout=300"):
        initial_params(build({**BASE, "init-from": str(out)}))
    # a new head on request
    renew = initial_params(build({**BASE, "pretrain.holdout": 300, "init-from": str(out),
                                  "init-reinit": "3"}))
    assert np.array_equal(renew["3.weight"], fresh["3.weight"])
    assert np.array_equal(renew["1.weight"], blob["state_dict"]["1.weight"].numpy())


def test_init_from_refuses_what_does_not_fit(tmp_path):
    ref = from_torch(model(build(BASE)).state_dict())
    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    torch.save(other.state_dict(), tmp_path / "other.pth")
    with pytest.raises(ConfigError, match=r"shape .*1\.weight \(32, 64\) here \(64, 64\)"):
        pretrain.load_initial(tmp_path / "other.pth", ref, [])
    torch.save({"1.weight": torch.zeros(1)}, tmp_path / "partial.pth")
    with pytest.raises(ConfigError, match="missing"):
        pretrain.load_initial(tmp_path / "partial.pth", ref, [])
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 40)
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        pretrain.load_initial(tmp_path / "junk.pt", ref, [])
    with pytest.raises(ConfigError, match="no file"):
        pretrain.load_initial(tmp_path / "none.pt", ref, [])
    # a plain torchvision-style state dict with the stem and head kept fresh
    sd = {k: torch.from_numpy(v.copy()) for k, v in ref.items()}
    sd["1.weight"] = torch.zeros(32, 64)
    torch.save(sd, tmp_path / "tv.pth")
    got, prov = pretrain.load_initial(tmp_path / "tv.pth", ref, ["1"])
    assert prov == {} and np.array_equal(got["1.weight"], ref["1.weight"])


def test_head_is_the_last_linear_layer():
    net = model(build(BASE))
    assert pretrain.head_name(from_torch(net.state_dict())) == "3"
    before = net[3].weight.detach().clone()
    assert pretrain.reinit_head(net, 0) == "3" and not torch.equal(before, net[3].weight)
