"""A trainer that always fails on one partition (a site whose training crashes), for
``test_fedelmy_sim.py``: named in the ``plugins`` key, registered with one line."""

from __future__ import annotations

from dataclasses import dataclass

from clients import TRAINERS
from clients.base import TrainJob, TrainResult
from clients.fedelmy import FedSeqOptions, FedSeqTrainer
from fedsys.options import option


@dataclass(frozen=True)
class FlakyOptions(FedSeqOptions):
    """Config keys ``flaky.*``."""

    partition: int = option(1, "The partition whose training always fails.", bounds=">= 0")


class FlakyTrainer(FedSeqTrainer):
    """FedSeq's training, except on ``flaky.partition``, where it raises."""

    name = "flaky"
    Options = FlakyOptions

    def train(self, job: TrainJob) -> TrainResult:
        if job.partition_id == job.options.partition:
            raise RuntimeError(f"site {job.partition_id} crashed while training")
        return super().train(job)


TRAINERS["flaky"] = FlakyTrainer
