"""FedProx local objective (Li et al., MLSys 2020, Eq. 2).

``h_k(w; w^t) = F_k(w) + (mu / 2) * ||w - w^t||^2``, minimised by SGD from ``w^t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clients.base import BatchSpec, Trainer, TrainJob, TrainResult, sgd_loop
from fedsys.options import option

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class FedProxOptions:
    """The proximal trainer's options (config keys ``fedprox.*``)."""

    mu: float = option(0.01, "FedProx proximal coefficient mu.", bounds=">= 0")


def proximal_term(net: nn.Module, anchor: list[torch.Tensor], mu: float) -> torch.Tensor:
    """``(mu / 2) * sum ||w - w^t||^2`` over trainable parameters."""
    import torch

    sq = sum(((p - a) ** 2).sum() for p, a in zip(net.parameters(), anchor, strict=True))
    return 0.5 * mu * torch.as_tensor(sq)


class FedProxTrainer(Trainer):
    """SGD on cross-entropy plus the proximal term (Eq. 2), ``mu = fedprox.mu``."""

    name = "fedprox"
    Options = FedProxOptions

    def train(self, job: TrainJob) -> TrainResult:
        """Minimise Eq. 2's :math:`h_k` from the received model."""
        mu = float(job.options.mu)
        cfg = job.config
        anchor = [p.detach().clone().to(cfg.device) for p in job.net.parameters()]
        return sgd_loop(job.net, job.x, job.y, job.normalise, cfg,
                        penalty=lambda m: proximal_term(m, anchor, mu))

    def batch_spec(self, job: TrainJob) -> BatchSpec:
        """Eq. 2 trains together with others (:mod:`clients.batched`), ``mu`` each's own."""
        return BatchSpec(mu=float(job.options.mu))
