"""FedAvgM (Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification", 2019, §3): FedAvg with server momentum, as Flower's
``FedAvgM`` builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np

from fedsys.options import option
from fedsys.params import Params
from fedsys.server_opt import momentum_step
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.settings import RoundSettingsKw, checked_options


@dataclass(frozen=True)
class FedAvgMOptions:
    """The server step's options (config keys ``fedavgm.*``; Flower's keywords)."""

    server_learning_rate: float = option(
        1.0, "FedAvgM: server learning rate eta (Flower's server_learning_rate; 1 with "
        "momentum 0 is FedAvg).", bounds="> 0")
    server_momentum: float = option(
        0.0, "FedAvgM: server momentum beta (Flower's server_momentum; 0: none).",
        bounds="[0, 1)")


class FedAvgMStrategy(FedsysStrategy):
    r"""Federated averaging with server momentum.

    With :math:`\bar w` the example-weighted mean of the accepted updates (a robust
    rule's in its place, then the wrappers, as FedAdam's), the pseudo-gradient
    :math:`\Delta = w^t - \bar w`, the velocity :math:`v \leftarrow \beta v + \Delta` and
    :math:`w^{t+1} = w^t - \eta v` (§3; :func:`fedsys.server_opt.momentum_step`).  Built
    like Flower's ``FedAvgM``::

        FedAvgMStrategy(server_learning_rate=0.1, server_momentum=0.9, fraction_train=0.5)

    With :math:`\eta = 1` and :math:`\beta = 0` it is FedAvg, bit for bit.

    Parameters
    ----------
    server_learning_rate, server_momentum : float, default 1.0, 0.0
        :math:`\eta` and :math:`\beta`, Flower's keywords: :class:`FedAvgMOptions`'s fields
        (the config keys ``fedavgm.*``, documented there).
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    name = "fedavgm"
    default_trainer = "sgd"
    Options = FedAvgMOptions
    traits = Traits(asks="sample", mean="round")
    foreign_model = ("it becomes the model the round sends and the server step starts "
                     "from; the velocity stays")

    def __init__(self, *, server_learning_rate: float = 1.0, server_momentum: float = 0.0,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: FedAvgMOptions = checked_options(FedAvgMOptions(
            server_learning_rate=server_learning_rate, server_momentum=server_momentum),
            self.prefix())
        self.velocity: dict[str, np.ndarray] = {}

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """The weighted client mean; after the wrappers, the server momentum step."""
        avg = self.average(server_round, [u.params for u in updates], [u.num_examples for u in updates])
        return Aggregate(avg, then=self._step)

    def _step(self, server_round: int, models: dict[int, Params], changed: bool) -> Params:
        """The server momentum step from the client mean as the wrappers left it."""
        assert self.params is not None
        o: FedAvgMOptions = self.options
        return momentum_step(self.params, models[0], self.velocity, o.server_learning_rate,
                             o.server_momentum)

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the velocity."""
        state = super().state_dict()
        state["fedavgm"] = {"velocity": {k: a.copy() for k, a in self.velocity.items()}}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        super().load_state_dict(state)
        self.velocity = {k: a.copy() for k, a in state["fedavgm"]["velocity"].items()}
