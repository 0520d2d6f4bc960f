"""FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2), at Flower's defaults unless told otherwise; the IMA paper's code runs them with
``fedopt.lr: 0.01`` and ``fedopt.bias-correction: false`` (spec ``fedima.md`` §2.5)."""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO
from typing import Any, ClassVar

import numpy as np
from flwr.supercore import log

from fedsys.options import option
from fedsys.params import Params
from fedsys.server_opt import OptConfig, step
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits


@dataclass(frozen=True)
class FedOptOptions:
    """The server optimiser's options (config keys ``fedopt.*``, shared by FedAdam and
    FedYogi)."""

    lr: float = option(0.0, "FedAdam/FedYogi: server learning rate (Flower's eta); 0: Flower's "
                       "default for the method, FedAdam 0.1, FedYogi 0.01 (the IMA code: 0.01).",
                       bounds=">= 0")
    tau: float = option(1e-3, "FedAdam/FedYogi: adaptivity tau.", bounds="> 0")
    beta1: float = option(0.9, "FedAdam/FedYogi: first-moment decay.", bounds="[0, 1]")
    beta2: float = option(0.99, "FedAdam/FedYogi: second-moment decay.", bounds="[0, 1]")
    bias_correction: str = option(
        "auto", "FedAdam/FedYogi: Adam bias correction as Flower's FedAdam applies it (its "
        "exponent server_round + 1); auto: Flower's way for the method (FedAdam corrects, "
        "FedYogi does not); false: none (the IMA code's).", choices=("auto", "true", "false"))


class FedOptStrategy(FedsysStrategy):
    r"""Weighted mean of the clients, then a server optimiser step on the
    pseudo-gradient :math:`\Delta = \tilde x - w` (Alg. 2).

    Built like Flower's ``FedAdam`` / ``FedYogi``: its keywords ``eta``, ``beta_1``,
    ``beta_2``, ``tau`` are the options ``lr``, ``beta1``, ``beta2``, ``tau``, with Flower's
    defaults (:attr:`FLOWER_DEFAULTS`: FedAdam ``eta=0.1`` with Adam's bias correction,
    FedYogi ``eta=0.01`` without; ``beta_1=0.9``, ``beta_2=0.99``, ``tau=1e-3`` both), so the
    same replies give Flower's model; ``eta_l`` is kept as Flower keeps it (Flower sends it
    to no client either).  The IMA paper's code runs both at ``lr=0.01`` without the
    correction (``bias_correction=False``); fedsys's defaults were those until issue 77.

    The client mean passes through the wrappers *before* the step (``Aggregate.then``):
    IMA then averages its window of client means (spec §2.5: IMA goes between
    averaging and the Adam step).
    """

    kind: ClassVar[str] = "adam"
    Options = FedOptOptions
    option_prefix = "fedopt"
    traits = Traits(asks="sample", mean="round")
    foreign_model = ("it becomes the model the round sends and the server optimiser steps "
                     "from (as Flower's FedOpt takes its current_arrays); the moments stay")
    #: Flower's ``FedAdam`` / ``FedYogi`` keywords -> the options they mean
    FLOWER_NAMES: ClassVar[dict[str, str]] = {"eta": "lr", "beta_1": "beta1", "beta_2": "beta2"}
    #: Flower's defaults for the method: ``eta`` (``lr`` 0), ``eta_l``, and whether it
    #: corrects the bias (``bias_correction="auto"``); Flower 1.42's FedAdam
    FLOWER_DEFAULTS: ClassVar[tuple[float, float, bool]] = (0.1, 0.1, True)

    def __init__(self, *, eta_l: float | None = None, **kwargs: Any) -> None:
        for flower, ours in self.FLOWER_NAMES.items():
            if flower in kwargs:
                if ours in kwargs:
                    raise TypeError(f"{type(self).__name__}() got both {flower!r} (Flower's name) "
                                    f"and {ours!r}: give one")
                kwargs[ours] = kwargs.pop(flower)
        super().__init__(**kwargs)
        eta, flower_eta_l, correct = self.FLOWER_DEFAULTS
        #: Flower's ``eta_l`` (the clients' lr; Flower's default for the method unless
        #: given), kept as Flower's strategy keeps it (it sends it to no client); the
        #: clients' lr is the ``lr`` of the train config
        self.eta_l = flower_eta_l if eta_l is None else eta_l
        o: FedOptOptions = self.options
        bias = correct if o.bias_correction == "auto" else o.bias_correction == "true"
        self.opt = OptConfig(o.lr or eta, o.tau, o.beta1, o.beta2, bias)
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """Alg. 2: the weighted client mean; after the wrappers, the server step."""
        avg = self.average(server_round, [u.params for u in updates], [u.num_examples for u in updates])
        return Aggregate(avg, then=self._step)

    def _step(self, server_round: int, models: dict[int, Params], changed: bool) -> Params:
        """The server optimiser step from the client mean as the wrappers left it."""
        assert self.params is not None
        # the bias correction's exponent is Flower's FedAdam's, server_round + 1 (legacy
        # and Message API): with it on, the same replies give Flower's model
        return step(self.kind, self.params, models[0], self.m, self.v, server_round + 1, self.opt)

    def summary(self) -> None:
        """The base's summary, then the server step's values (the defaults resolved)."""
        super().summary()
        c = self.opt
        log(INFO, "[%s] server step: eta %g, beta_1 %g, beta_2 %g, tau %g, bias correction %s",
            self.label, c.lr, c.beta1, c.beta2, c.tau, "on" if c.bias_correction else "off")

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the moments (the step is the round: nothing else to keep)."""
        state = super().state_dict()
        state["fedopt"] = {"m": {k: a.copy() for k, a in self.m.items()},
                           "v": {k: a.copy() for k, a in self.v.items()}}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a checkpoint from before 2026-12-05 also holds
        a step count, no longer used)."""
        super().load_state_dict(state)
        s = state["fedopt"]
        self.m = {k: a.copy() for k, a in s["m"].items()}
        self.v = {k: a.copy() for k, a in s["v"].items()}


class FedAdamStrategy(FedOptStrategy):
    """FedAdam: Adam moments on the pseudo-gradient."""

    name = "fedadam"
    kind = "adam"


class FedYogiStrategy(FedOptStrategy):
    """FedYogi: Yogi's additive second-moment update on the pseudo-gradient."""

    name = "fedyogi"
    kind = "yogi"
    #: Flower 1.42's FedYogi: eta 0.01, eta_l 0.0316, no bias correction
    FLOWER_DEFAULTS: ClassVar[tuple[float, float, bool]] = (0.01, 0.0316, False)
