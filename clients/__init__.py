"""Client side of fedsys: the local trainers, one file each.

:data:`TRAINERS` is the one place a trainer becomes known: one line per trainer.
"""

from __future__ import annotations

from clients.base import LocalConfig, Trainer, TrainJob, TrainResult
from clients.fedelmy import FedElmyTrainer, FedSeqTrainer
from clients.fedprox import FedProxTrainer
from clients.lss import LssTrainer
from clients.sgd import SGDTrainer

#: ``trainer`` name -> trainer class.
TRAINERS: dict[str, type[Trainer]] = {
    "sgd": SGDTrainer,
    "fedprox": FedProxTrainer,
    "fedseq": FedSeqTrainer,
    "fedelmy": FedElmyTrainer,
    "lss": LssTrainer,
}

__all__ = ["TRAINERS", "LocalConfig", "TrainJob", "TrainResult", "Trainer"]
