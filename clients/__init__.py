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

def trainer_class(trainer: str | type[Trainer]) -> type[Trainer]:
    """A trainer by its name in :data:`TRAINERS` (or the class itself, one of your own).

    Raises
    ------
    ValueError
        An unknown name, listing the registered ones.
    """
    if not isinstance(trainer, str):
        return trainer
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; registered: {', '.join(TRAINERS)}")
    return TRAINERS[trainer]


__all__ = ["TRAINERS", "LocalConfig", "TrainJob", "TrainResult", "Trainer", "trainer_class"]
