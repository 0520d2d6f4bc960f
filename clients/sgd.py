"""Plain local SGD: the FedAvg client (McMahan et al. 2017, Alg. 1, ClientUpdate)."""

from __future__ import annotations

from clients.base import BatchSpec, Trainer, TrainJob, TrainResult, sgd_loop


class SGDTrainer(Trainer):
    """``epochs`` epochs of mini-batch SGD on cross-entropy, in place."""

    name = "sgd"

    def train(self, job: TrainJob) -> TrainResult:
        """Alg. 1's ClientUpdate on the node's data."""
        return sgd_loop(job.net, job.x, job.y, job.normalise, job.config)

    def batch_spec(self, job: TrainJob) -> BatchSpec:
        """Plain SGD trains together with others (:mod:`clients.batched`)."""
        del job
        return BatchSpec()
