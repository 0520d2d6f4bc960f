"""A strategy and a trainer outside fedsys, as a user writes them (docs/extending.md).

Each declares one option of its own and is registered with one line; naming this
module in the ``plugins`` key makes the ServerApp and every ClientApp import it.
Used by ``test_extending.py`` (not imported by pytest itself, so the test session's
registries stay as shipped).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Unpack

import numpy as np

from clients import TRAINERS
from clients.base import Trainer, TrainJob, TrainResult, sgd_loop
from fedsys.options import option
from fedsys.params import is_float
from fedsys.validation import ClientUpdate
from strategies import REGISTRY
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.settings import RoundSettingsKw, checked_options


@dataclass(frozen=True)
class DampedOptions:
    """Config keys ``damped.*``."""

    keep: float = option(0.25, "Share of the old global model kept each round.", bounds="[0, 1)")


class DampedAvg(FedsysStrategy):
    """FedAvg whose new model keeps ``keep`` of the old one (a test strategy)."""

    name = "damped"
    default_trainer = "counting"
    Options = DampedOptions
    traits = Traits(asks="sample", mean="round")  # what the wrappers read of it

    def __init__(self, *, keep: float = 0.25, **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: DampedOptions = checked_options(DampedOptions(keep=keep), self.prefix())

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        assert self.params is not None
        avg = self.average(server_round, [u.params for u in updates],
                           [u.num_examples for u in updates])
        k = self.options.keep
        new = {n: (k * self.params[n] + (1 - k) * v).astype(v.dtype) if is_float(v) else v
               for n, v in avg.items()}
        seen = [u.metrics["rounds-seen"] for u in updates]  # the round's own numbers
        return Aggregate(new, {"rounds-seen-min": min(seen), "rounds-seen-max": max(seen)})


@dataclass(frozen=True)
class CountingOptions:
    """Config keys ``counting.*``."""

    max_batches: int = option(3, "Mini-batches per round.", bounds="> 0")


class CountingTrainer(Trainer):
    """Plain SGD for ``max_batches`` steps that counts, in its node state, the rounds it
    trained (a test trainer)."""

    name = "counting"
    Options = CountingOptions

    def train(self, job: TrainJob) -> TrainResult:
        res = sgd_loop(job.net, job.x, job.y, job.normalise,
                       replace(job.config, max_steps=job.options.max_batches))
        seen = int(job.state.get("rounds", 0)) + 1
        res.state = {"rounds": seen, "last": {"w": np.full(2, seen, np.float32)}}
        res.metrics = {"rounds-seen": seen}
        return res


REGISTRY["damped"] = DampedAvg
TRAINERS["counting"] = CountingTrainer
