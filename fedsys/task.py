"""Glue shared by server and clients: seeds, devices, partitions, models, evaluation."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedsys import domains, pretrain
from fedsys import partition as part
from fedsys.config import ConfigError, RunConfig
from fedsys.data import Dataset, load_dataset
from fedsys.models import build_model
from fedsys.params import Params, from_torch


def pick_device(name: str) -> torch.device:
    """Resolve ``auto`` to CUDA when present, else CPU."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def dataset(cfg: RunConfig) -> Dataset:
    """The configured dataset (cached per process)."""
    return load_dataset(cfg.dataset, cfg.data_dir)


@functools.lru_cache(maxsize=8)
def _holdout(dataset_name: str, data_dir: str, n: int, split: str, labels: str) -> np.ndarray:
    ds = load_dataset(dataset_name, data_dir)
    classes = pretrain.parse_labels(labels, ds.num_classes) if split == "labels" else None
    return pretrain.holdout_indices(ds.y_train.numpy(), n, split, classes)


def holdout(cfg: RunConfig) -> np.ndarray:
    """The training indices held out for ``fedsys pretrain`` (empty without one)."""
    n = int(cfg.get("pretrain.holdout"))
    if n == 0:
        return np.zeros(0, np.int64)
    return _holdout(cfg.dataset, cfg.data_dir, n, str(cfg.get("pretrain.split")),
                    str(cfg.get("pretrain.labels")))


@functools.lru_cache(maxsize=8)
def _partitions(
    dataset_name: str, data_dir: str, kind: str, n: int, seed: int,
    alpha: float, min_size: int, spc: int, held: tuple[int, str, str] = (0, "", ""),
    cap: int = 0,
) -> tuple[np.ndarray, ...]:
    labels = load_dataset(dataset_name, data_dir).y_train.numpy()
    rest = None
    if held[0]:  # clients never get the held-out samples: partition the rest
        mask = np.ones(len(labels), bool)
        mask[_holdout(dataset_name, data_dir, *held)] = False
        rest = np.flatnonzero(mask)
        labels = labels[rest]
    if kind in ("iid", "domain"):  # domain: IID samples, a transform per client
        parts = part.iid(labels, n, seed)
    elif kind == "dirichlet":
        parts = part.dirichlet(labels, n, seed, alpha, min_size)
    elif kind == "dirichlet-balanced":
        parts = part.dirichlet_balanced(labels, n, seed, alpha)
    elif kind == "dirichlet-capped":
        parts = part.dirichlet_capped(labels, n, seed, alpha, min_size)
    else:
        parts = part.shards(labels, n, seed, spc)
    if rest is not None:
        parts = [rest[p] for p in parts]
    return tuple(part.subsample(parts, cap, seed))


PartitionKey = tuple[str, str, str, int, int, float, int, int, tuple[int, str, str], int]


def _partition_key(cfg: RunConfig, num_partitions: int | None) -> PartitionKey:
    """Everything that decides the partitions (the arguments of :func:`_partitions`)."""
    held = (int(cfg.get("pretrain.holdout")), str(cfg.get("pretrain.split")),
            str(cfg.get("pretrain.labels")))
    return (cfg.dataset, cfg.data_dir, cfg.partition, num_partitions or cfg.num_clients,
            cfg.seed, cfg.dirichlet_alpha, cfg.dirichlet_min_size, cfg.shards_per_client,
            held if held[0] else (0, "", ""), cfg.samples_per_client)


def partitions(cfg: RunConfig, num_partitions: int | None = None) -> list[np.ndarray]:
    """Index arrays of every client, identical on server and clients for one seed
    (without the samples held out for pre-training)."""
    return list(_partitions(*_partition_key(cfg, num_partitions)))


def initial_params(cfg: RunConfig) -> Params:
    """The run's starting model: ``init-from`` (checked against the model, see
    :func:`fedsys.pretrain.load_initial`) or the seeded random one."""
    from pathlib import Path

    fresh = from_torch(model(cfg).state_dict())
    if not cfg.init_from:
        return fresh
    reinit = [r.strip() for r in cfg.init_reinit.split(",") if r.strip()]
    params, prov = pretrain.load_initial(Path(cfg.init_from).expanduser(), fresh, reinit)
    held = prov.get("holdout")
    if held and prov.get("dataset") == cfg.dataset:
        import hashlib

        mine = holdout(cfg)
        if hashlib.sha256(mine.tobytes()).hexdigest() != held.get("indices-sha256"):
            raise ConfigError(
                f"config key 'init-from': {cfg.init_from} was pre-trained on {held['samples']} "
                f"held-out samples ({held['split']}) that this run's clients would see; hold "
                f"out the same: pretrain.holdout={held['samples']} pretrain.split={held['split']}"
                + (f" pretrain.labels={held['labels']}" if held["split"] == "labels" else ""))
    return params


def client_data(cfg: RunConfig, pid: int, num_partitions: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition ``pid``'s raw training images and labels (with ``partition: domain``,
    seen through that client's domain transform).

    Selected once per process and partitioning: a simulation actor serves many clients
    over many rounds, and selecting a client's samples cost more than one training step
    of a small model (``benchmarks/client_overhead.py``).  The partitions are disjoint,
    so the cache holds at most one copy of the training set per partitioning.  The
    tensors are shared between calls: read them, never write into them.
    """
    return _client_data(_partition_key(cfg, num_partitions), pid)


@functools.lru_cache(maxsize=4096)
def _client_data(key: PartitionKey, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_dataset(key[0], key[1])
    idx = torch.from_numpy(_partitions(*key)[pid])
    x, y = ds.x_train[idx], ds.y_train[idx]
    if key[2] == "domain":
        x = domains.apply(domains.domain_of(pid, key[4]), x)
    return x, y


def test_sets(cfg: RunConfig) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The central test split(s): ``[("", x, y)]``, or with ``partition: domain`` one
    ``(label, x, y)`` per client's domain (their union is the test set scored)."""
    ds = dataset(cfg)
    n = cfg.test_subset or len(ds.y_test)
    x, y = ds.x_test[:n], ds.y_test[:n]
    if cfg.partition != "domain":
        return [("", x, y)]
    out = []
    for k in range(cfg.num_clients):
        d = domains.domain_of(k, cfg.seed)
        out.append((f"domain-{k}", domains.apply(d, x), y))
    return out


def model(cfg: RunConfig, ds: Dataset | None = None) -> nn.Module:
    """The configured model, initialised from the run seed."""
    ds = ds or dataset(cfg)
    return build_model(cfg.model, ds.input_shape, ds.num_classes, cfg.seed, cfg.model_norm)


@torch.no_grad()
def evaluate(
    net: nn.Module,
    ds: Dataset,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``net`` on ``(x, y)``."""
    return score(net, ds.normalise, x, y, batch_size, device)


@torch.no_grad()
def score(
    net: nn.Module,
    normalise: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``net`` on raw ``(x, y)`` (``normalise``
    maps a raw batch to the model's input)."""
    net.to(device).eval()
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        xb = normalise(x[i : i + batch_size]).to(device)
        yb = y[i : i + batch_size].to(device)
        out = net(xb)
        loss_sum += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    n = max(len(y), 1)
    return loss_sum / n, correct / n
