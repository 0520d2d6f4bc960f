"""Local training: plain PyTorch functions that know nothing of Flower.

A trainer takes the model (already holding the global weights), the client's data
and a :class:`LocalConfig`, trains in place, and returns :class:`LocalResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LocalConfig:
    """Hyperparameters of one round of local training."""

    epochs: int = 1
    max_steps: int = 0
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalResult:
    """What a trainer reports: examples seen per epoch, last-epoch mean loss, steps."""

    num_examples: int
    train_loss: float
    steps: int


Normalise = Callable[[torch.Tensor], torch.Tensor]
Trainer = Callable[[nn.Module, torch.Tensor, torch.Tensor, Normalise, LocalConfig], LocalResult]


def batches(
    n: int, batch_size: int, epochs: int, seed: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(epoch, indices)`` of seeded shuffled mini-batches."""
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            yield epoch, perm[i : i + batch_size]


def sgd_loop(
    net: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    normalise: Normalise,
    cfg: LocalConfig,
    penalty: Callable[[nn.Module], torch.Tensor] | None = None,
) -> LocalResult:
    """Mini-batch SGD on cross-entropy (plus an optional penalty term).

    Returns the mean data loss (without the penalty) of the last epoch.
    """
    device = torch.device(cfg.device)
    net.to(device).train()
    opt = torch.optim.SGD(
        net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    torch.manual_seed(cfg.seed)  # dropout and similar layers
    steps, last_epoch, loss_sum, loss_n = 0, -1, 0.0, 0
    for epoch, idx in batches(len(y), cfg.batch_size, cfg.epochs, cfg.seed):
        if epoch != last_epoch:
            last_epoch, loss_sum, loss_n = epoch, 0.0, 0
        xb, yb = normalise(x[idx]).to(device), y[idx].to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(xb), yb)
        total = loss + penalty(net) if penalty is not None else loss
        total.backward()
        opt.step()
        loss_sum += float(loss.detach()) * len(idx)
        loss_n += len(idx)
        steps += 1
        if cfg.max_steps and steps >= cfg.max_steps:
            break
    if loss_n and not torch.isfinite(torch.tensor(loss_sum)):
        raise FloatingPointError("local training diverged (loss is NaN or Inf)")
    return LocalResult(len(y), loss_sum / max(loss_n, 1), steps)
