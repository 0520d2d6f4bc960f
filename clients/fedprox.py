"""FedProx local objective (Li et al., MLSys 2020, Eq. 2).

``h_k(w; w^t) = F_k(w) + (mu / 2) * ||w - w^t||^2``, minimised by SGD from ``w^t``.
"""

from __future__ import annotations

import torch
from torch import nn

from clients.base import LocalConfig, LocalResult, Normalise, sgd_loop


def proximal_term(net: nn.Module, anchor: list[torch.Tensor], mu: float) -> torch.Tensor:
    """``(mu / 2) * sum ||w - w^t||^2`` over trainable parameters."""
    sq = sum(((p - a) ** 2).sum() for p, a in zip(net.parameters(), anchor, strict=True))
    return 0.5 * mu * torch.as_tensor(sq)


def train_fedprox(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, normalise: Normalise, cfg: LocalConfig
) -> LocalResult:
    """SGD on cross-entropy plus the proximal term, ``mu = cfg.extra['mu']``."""
    mu = float(cfg.extra.get("mu", 0.0))
    anchor = [p.detach().clone().to(cfg.device) for p in net.parameters()]
    return sgd_loop(net, x, y, normalise, cfg, penalty=lambda m: proximal_term(m, anchor, mu))
