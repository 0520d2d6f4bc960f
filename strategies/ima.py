"""IMA: iterative moving averaging of global models, composed with any fedsys strategy
(Zhou et al., "Mitigating Data Heterogeneity in Federated Learning with Iterative
Moving Averaging of Global Models", Algorithm 1; spec ``fedima.md`` §2.3-2.5).

IMA is a :class:`~strategies.wrapper.StrategyWrapper`: it holds the strategy it wraps and
acts on the models that strategy's aggregate makes, before they are sent and evaluated
(the engine passes them through it), and on the client learning rate.  In a Flower app::

    strategy = IMA(FedAvgStrategy(fraction_train=0.1), window=5, start_fraction=0.75)

``strategy: ima`` with ``ima.base: <strategy>`` builds the same from a run config.
The maths is in :mod:`fedsys.ima`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from logging import INFO
from typing import Any

from flwr.supercore import log

from fedsys import ima
from fedsys.options import REGISTERED_STRATEGIES, option, parse_group
from fedsys.params import Params, copy, mean
from strategies.wrapper import StrategyWrapper


@dataclass(frozen=True)
class ImaOptions:
    """IMA's options (config keys ``ima.*``)."""

    base: str = option("fedavg", "IMA: the strategy whose global models are averaged.",
                       choices=REGISTERED_STRATEGIES)
    window: int = option(5, "IMA: P, global models in the moving-average window.",
                         bounds="> 0")
    start_fraction: float = option(
        0.75, "IMA: t_s as a fraction of the run's rounds (t_s = floor(f*T)).",
        bounds="[0, 1]")
    start_round: int = option(
        -1, "IMA: t_s as a 0-indexed round (>= 0 overrides ima.start-fraction).",
        bounds=">= -1")
    lr_decay: float = option(0.97, "IMA: extra per-round client lr decay from t_s on "
                             "(1 = none).", bounds="(0, 1]")
    average: bool = option(
        True, "IMA: average the window; false keeps only the lr schedule (the 'same decay, "
        "no averaging' control).")
    code_start_rule: bool = option(
        False, "IMA: also wait until t >= P before averaging (the authors' code) instead of "
        "averaging the min(P, t+1) models there are.")


class IMA(StrategyWrapper):
    r"""Iterative moving averaging on top of a strategy.

    Every round the wrapped strategy aggregates as usual and each model it makes
    (:math:`\theta^t`) is pushed into a window of its last P models (never IMA
    outputs).  From round :math:`t_s` on the model broadcast and evaluated is the
    window's uniform mean :math:`\bar\theta^t = \frac{1}{P}\sum_{\tau=t-P+1}^{t}\theta^\tau`
    (Eq. 5), and the client learning rate is :math:`\eta_0\gamma^{t_s}\gamma_{IMA}^{t-t_s}`
    (spec §2.4).  :math:`t_s` comes from the run's length (``num_rounds`` of
    :meth:`~strategies.base.FedsysStrategy.start`).  A round without usable updates
    pushes nothing (spec §6 item 6).

    Each model slot the strategy passes keeps its own window: one for strategies with
    one global model (FedAvg, FedProx, FedCDA), the client mean before the optimiser
    step for FedAdam/FedYogi (spec §2.5), and one per middleware model for FedCross
    (fedsys's own extension; the paper has no multi-model method).

    Parameters
    ----------
    strategy : FedsysStrategy or StrategyWrapper
        The strategy whose models are averaged (see
        :class:`~strategies.wrapper.StrategyWrapper`).
    **options
        :class:`ImaOptions`'s fields (``base`` is only read by :meth:`from_config`).
    """

    name = "ima"
    Options = ImaOptions
    foreign_model = ("IMA's window keeps the rounds' aggregates, which the foreign model "
                     "does not enter; the average it sends from its start is the window's")

    def __init__(self, strategy: Any, **options: Any) -> None:
        self.options: ImaOptions = parse_group(ImaOptions, self.name, options)
        super().__init__(strategy)
        self.P = self.options.window
        self.t_s = 0
        #: The method under IMA, by name (as its log says).
        self.base_name = str(self.engine.name)
        self.windows: dict[int, deque[Params]] = {}
        self.active = False
        self._round = 0

    def on_start(self, num_rounds: int) -> None:
        """Resolve :math:`t_s` from the run's length."""
        o = self.options
        self.t_s = ima.start_round(num_rounds, o.start_fraction, o.start_round)

    def own_schedule_keys(self) -> list[str]:
        """:math:`t_s` as a fraction of the run, unless ``start_round`` is given."""
        return [] if self.options.start_round >= 0 else ["ima.start-fraction"]

    def own_branch_late_keys(self, rnd: int) -> frozenset[str]:
        """Averaging and IMA's lr decay act from round :math:`t_s + 1` on: up to round
        :math:`t_s` a branch may set them otherwise (the models and the lr so far are
        the base strategy's)."""
        return frozenset({"ima.average", "ima.lr-decay"}) if rnd <= self.t_s else frozenset()

    def inert_options(self, num_rounds: int) -> list[str]:
        """A start after the last round, or a window of one model, leaves IMA without an
        average.  A start at the last round is allowed: the final model is then the mean
        of the window (a last-round average, as stochastic weight averaging ends)."""
        o, out = self.options, []
        if self.t_s >= num_rounds:
            key = (f"ima.start-round={o.start_round}" if o.start_round >= 0
                   else f"ima.start-fraction={o.start_fraction:g}")
            out.append(f"{key} starts IMA at round {self.t_s + 1}, after the run's last round "
                       f"{num_rounds}: it would never average")
        if o.average and self.P == 1:
            out.append("ima.window=1 averages a window of one model, the model itself: IMA "
                       "would only decay the lr (ima.average=false says so on purpose)")
        return out

    def own_summary(self) -> None:
        """Log P, t_s and the late lr decay."""
        o = self.options
        log(INFO, "[ima] base=%s, window P=%d, t_s=%d (Flower round %d), then lr decay %g "
            "per round, averaging %s", self.base_name, self.P, self.t_s, self.t_s + 1,
            o.lr_decay, "on" if o.average else "OFF")

    def schedule_lr(self, server_round: int, lr: float, lr_decay: float, current: float) -> float:
        """Spec §2.4's schedule from the caller's ``lr``."""
        return ima.client_lr(server_round - 1, lr, lr_decay, self.t_s, self.options.lr_decay)

    def transform(self, server_round: int, slot: int, model: Params) -> Params:
        """Push ``model`` into its slot's window; from :math:`t_s` return the window mean."""
        t = server_round - 1
        if server_round != self._round:  # the first model of a round
            self._round, self.active = server_round, False
        win = self.windows.setdefault(slot, deque(maxlen=self.P))
        win.append(copy(model))
        o = self.options
        if o.average and ima.averaging_active(t, self.t_s, self.P, o.code_start_rule):
            self.active = True
            return mean(list(win))
        return model

    def round_metrics(self) -> dict[str, float]:
        """``ima-active`` (the window mean replaced a model this round) and ``ima-window`` (models in the fullest window)."""
        return {"ima-active": float(self.active),
                "ima-window": float(max((len(w) for w in self.windows.values()), default=0))}

    def own_state(self) -> dict[str, Any]:
        """The windows, per slot."""
        return {str(k): [copy(m) for m in w] for k, w in self.windows.items()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`own_state` output."""
        self.windows = {int(k): deque((copy(m) for m in w), maxlen=self.P)
                        for k, w in state.items()}


__all__ = ["IMA", "ImaOptions"]
