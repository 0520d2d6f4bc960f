"""FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2), as the IMA paper's code runs them (spec ``fedima.md`` §2.5)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fedsys.aggregate import weighted_average
from fedsys.config import RunConfig
from fedsys.flwr_io import ClientUpdate
from fedsys.params import Params
from fedsys.server_opt import OptConfig, step
from strategies.base import FedsysStrategy


class FedOptStrategy(FedsysStrategy):
    r"""Weighted mean of the clients, then a server optimiser step on the
    pseudo-gradient :math:`\Delta = \tilde x - w` (Alg. 2).

    :meth:`transform_mean` sits between the mean and the step: IMA replaces it with
    the mean of its window of client means (spec §2.5: IMA goes between averaging
    and the Adam step).  No bias correction unless ``fedopt.bias-correction``
    (Flower's legacy FedAdam corrects; the IMA code does not).
    """

    kind: ClassVar[str] = "adam"
    server_optimizer: ClassVar[bool] = True

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.opt = OptConfig(cfg.fedopt__lr, cfg.fedopt__tau, cfg.fedopt__beta1,
                             cfg.fedopt__beta2, cfg.fedopt__bias_correction)
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.steps = 0

    def transform_mean(self, server_round: int, mean: Params) -> Params:
        """Hook between averaging and the optimiser step (identity here)."""
        return mean

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        assert self.params is not None
        mean = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        x = self.transform_mean(server_round, mean)
        self.steps += 1
        return step(self.kind, self.params, x, self.m, self.v, self.steps, self.opt)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedopt"] = {"m": {k: a.copy() for k, a in self.m.items()},
                           "v": {k: a.copy() for k, a in self.v.items()}, "steps": self.steps}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        s = state["fedopt"]
        self.m = {k: a.copy() for k, a in s["m"].items()}
        self.v = {k: a.copy() for k, a in s["v"].items()}
        self.steps = int(s["steps"])


class FedAdamStrategy(FedOptStrategy):
    """FedAdam: Adam moments on the pseudo-gradient."""

    name = "fedadam"
    kind = "adam"


class FedYogiStrategy(FedOptStrategy):
    """FedYogi: Yogi's additive second-moment update on the pseudo-gradient."""

    name = "fedyogi"
    kind = "yogi"
