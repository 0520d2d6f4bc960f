"""Plain local SGD: the FedAvg client (McMahan et al. 2017, Alg. 1, ClientUpdate)."""

from __future__ import annotations

import torch
from torch import nn

from clients.base import LocalConfig, LocalResult, Normalise, sgd_loop


def train_sgd(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, normalise: Normalise, cfg: LocalConfig
) -> LocalResult:
    """Run ``cfg.epochs`` epochs of mini-batch SGD on cross-entropy, in place."""
    return sgd_loop(net, x, y, normalise, cfg)
