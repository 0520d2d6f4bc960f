"""FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2), at Flower's defaults unless told otherwise; the IMA paper's code runs them with
``fedopt.lr: 0.01`` and ``fedopt.bias-correction: false`` (spec ``fedima.md`` §2.5)."""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO
from typing import TYPE_CHECKING, Any, ClassVar, Self, Unpack

import numpy as np
from flwr.supercore import log

from fedsys.options import ConfigError, option
from fedsys.params import Params
from fedsys.server_opt import OptConfig, step
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.settings import RoundSettingsKw, checked_options, config_settings

if TYPE_CHECKING:
    from fedsys.config import RunConfig
    from strategies.base import Builder


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

    Built like Flower's ``FedAdam`` / ``FedYogi``, with their keywords and defaults
    (:class:`FedAdamStrategy`, :class:`FedYogiStrategy`), so the same replies give Flower's
    model; ``eta_l`` is kept as Flower keeps it (Flower sends it to no client either).  A
    fedsys run config gives them as :class:`FedOptOptions` (``fedopt.lr`` is ``eta``,
    ``fedopt.beta1`` ``beta_1``, ``fedopt.beta2`` ``beta_2``; ``fedopt.lr: 0`` and
    ``fedopt.bias-correction: auto`` leave the class's default).  The IMA paper's code runs
    both at ``eta=0.01`` without the correction (``bias_correction=False``); fedsys's
    defaults were those until issue 77.

    The client mean passes through the wrappers *before* the step (``Aggregate.then``):
    IMA then averages its window of client means (spec §2.5: IMA goes between
    averaging and the Adam step).

    Parameters
    ----------
    eta : float
        Server learning rate (Flower's keyword), at least 0.
    eta_l : float
        Flower's client learning rate, kept as Flower's strategy keeps it (it sends it to no
        client); the clients' lr is the ``lr`` of the train config.
    beta_1, beta_2 : float
        First- and second-moment decay, in [0, 1].
    tau : float
        Adaptivity, above 0.
    bias_correction : bool
        Adam's bias correction as Flower's FedAdam applies it (its exponent
        ``server_round + 1``).
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    kind: ClassVar[str] = "adam"
    Options = FedOptOptions
    option_prefix = "fedopt"
    traits = Traits(asks="sample", mean="round")
    foreign_model = ("it becomes the model the round sends and the server optimiser steps "
                     "from (as Flower's FedOpt takes its current_arrays); the moments stay")
    #: The constructor's keywords (Flower's names) -> the options' fields (the config keys)
    CONFIG_NAMES: ClassVar[dict[str, str]] = {
        "eta": "lr", "beta_1": "beta1", "beta_2": "beta2", "tau": "tau",
        "bias_correction": "bias_correction"}

    def __init__(self, *, eta: float, eta_l: float, beta_1: float, beta_2: float, tau: float,
                 bias_correction: bool, **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        # the option's words: True or False as given, "false" too (the config key's
        # "auto" is the class's default, which the config leaves to the signature)
        self.options: FedOptOptions = checked_options(FedOptOptions(
            lr=eta, tau=tau, beta1=beta_1, beta2=beta_2,
            bias_correction=str(bias_correction).lower()), self.prefix())
        o = self.options
        if o.bias_correction == "auto":
            raise ConfigError(f"{type(self).__name__}: bias_correction=True or False "
                              "(unset: the class's default)")
        self.eta_l = eta_l
        self.opt = OptConfig(o.lr, o.tau, o.beta1, o.beta2, o.bias_correction == "true")
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    @classmethod
    def from_config(cls, cfg: RunConfig, build: Builder | None = None) -> Self:
        """The run config's ``fedopt.*`` under Flower's names; ``fedopt.lr: 0`` and
        ``fedopt.bias-correction: auto`` leave the class's default."""
        given = {k: v for k, v in cfg.fields_of(cls.prefix()).items()
                 if not ((k == "lr" and v == 0) or (k == "bias_correction" and v == "auto"))}
        keywords: dict[str, Any] = {flower: given[ours] for flower, ours in cls.CONFIG_NAMES.items()
                                    if ours in given}
        if "bias_correction" in keywords:
            keywords["bias_correction"] = keywords["bias_correction"] == "true"
        return cls(**config_settings(cfg), **keywords)

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
    """FedAdam: Adam moments on the pseudo-gradient, at Flower 1.42's ``FedAdam`` defaults
    (with Adam's bias correction, as Flower's).

    Parameters
    ----------
    eta, eta_l, beta_1, beta_2, tau, bias_correction
        As :class:`FedOptStrategy`'s.
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    name = "fedadam"
    kind = "adam"

    def __init__(self, *, eta: float = 0.1, eta_l: float = 0.1, beta_1: float = 0.9,
                 beta_2: float = 0.99, tau: float = 1e-3, bias_correction: bool = True,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau,
                         bias_correction=bias_correction, **settings)


class FedYogiStrategy(FedOptStrategy):
    """FedYogi: Yogi's additive second-moment update on the pseudo-gradient, at Flower
    1.42's ``FedYogi`` defaults (without bias correction, as Flower's).

    Parameters
    ----------
    eta, eta_l, beta_1, beta_2, tau, bias_correction
        As :class:`FedOptStrategy`'s.
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    name = "fedyogi"
    kind = "yogi"

    def __init__(self, *, eta: float = 0.01, eta_l: float = 0.0316, beta_1: float = 0.9,
                 beta_2: float = 0.99, tau: float = 1e-3, bias_correction: bool = False,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau,
                         bias_correction=bias_correction, **settings)
