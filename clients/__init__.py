"""Client side of fedsys: local trainers and the Flower ClientApp."""

from __future__ import annotations

from clients.base import LocalConfig, LocalResult, Trainer
from clients.fedprox import train_fedprox
from clients.sgd import train_sgd

TRAINERS: dict[str, Trainer] = {"sgd": train_sgd, "fedprox": train_fedprox}

__all__ = ["TRAINERS", "LocalConfig", "LocalResult", "Trainer"]
