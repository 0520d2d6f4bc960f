"""IMA: iterative moving averaging of global models, composed with any fedsys strategy
(Zhou et al., "Mitigating Data Heterogeneity in Federated Learning with Iterative
Moving Averaging of Global Models", Algorithm 1; spec ``fedima.md`` §2.3-2.5).

``strategy: ima`` with ``ima.base: fedavg|fedprox|fedcda|fedcross`` builds the base
strategy with IMA layered on top (:func:`ima_strategy`).  The maths is in
:mod:`fedsys.ima`.
"""

from __future__ import annotations

from collections import deque
from logging import INFO
from typing import Any

from flwr.supercore import log

from fedsys import ima
from fedsys.config import RunConfig
from fedsys.flwr_io import ClientUpdate
from fedsys.params import Params, copy
from strategies.base import FedsysStrategy


class ImaMixin(FedsysStrategy):
    r"""IMA on top of a base strategy (placed first in the MRO by :func:`ima_class`).

    Every round the base strategy aggregates as usual and its model :math:`\theta^t`
    is pushed into a window of the last P base models (never IMA outputs).  From
    round :math:`t_s` on the model broadcast and evaluated is the window's uniform
    mean :math:`\bar\theta^t = \frac{1}{P}\sum_{\tau=t-P+1}^{t}\theta^\tau` (Eq. 5),
    and the client learning rate is :math:`\eta_0\gamma^{t_s}\gamma_{IMA}^{t-t_s}`
    (spec §2.4).  A round without usable updates pushes nothing (spec §6 item 6).

    For strategies that send one global model (FedAvg, FedProx, FedCDA) IMA applies to
    that model.  For FedCross, which sends K middleware models, each slot keeps its
    own window and is replaced by the mean of its last P models; the global model is
    the mean of the averaged slots.  This per-slot form is fedsys's own extension
    (the paper has no multi-model method).
    """

    base_name = "base"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.t_s = ima.start_round(cfg.num_server_rounds, cfg.ima__start_fraction,
                                   cfg.ima__start_round)
        self.P = cfg.ima__window
        self.windows: dict[int, deque[Params]] = {}
        self.ima_active = False

    def summary(self) -> None:
        super().summary()
        log(INFO, "[ima] base=%s, window P=%d, t_s=%d (Flower round %d), lr decay %g then %g "
            "per round, averaging %s", self.base_name, self.P, self.t_s, self.t_s + 1,
            self.cfg.lr_decay, self.cfg.ima__lr_decay, "on" if self.cfg.ima__average else "OFF")

    def client_lr(self, server_round: int) -> float:
        c = self.cfg
        return ima.client_lr(server_round - 1, c.lr, c.lr_decay, self.t_s, c.ima__lr_decay)

    def _push(self, key: int, model: Params, t: int) -> Params:
        win = self.windows.setdefault(key, deque(maxlen=self.P))
        win.append(copy(model))
        if self.cfg.ima__average and ima.averaging_active(t, self.t_s, self.P,
                                                          self.cfg.ima__code_start_rule):
            return ima.window_mean(list(win))
        return model

    def transform_mean(self, server_round: int, mean: Params) -> Params:
        """Server-optimiser bases (FedAdam, FedYogi): IMA averages the window of
        client means before the optimiser step (spec §2.5)."""
        out = self._push(0, mean, server_round - 1)
        self.ima_active = out is not mean
        return out

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        if getattr(self, "server_optimizer", False):
            new = super().aggregate(server_round, updates)
            self.round_metrics = {**self.round_metrics, "ima-active": float(self.ima_active)}
            return new
        fma = super().aggregate(server_round, updates)
        if fma is None:
            return None
        t = server_round - 1
        slots: list[Params] | None = getattr(self, "slots", None)
        if slots is None:
            out = self._push(0, fma, t)
        else:
            changed: set[int] = set(getattr(self, "last_updated_slots", range(len(slots))))
            averaged = False
            for i in sorted(changed):
                new = self._push(i, slots[i], t)
                averaged = averaged or new is not slots[i]
                slots[i] = new
            # the base's own global model unless a slot was replaced (bit for bit before t_s)
            out = ima.window_mean(slots) if averaged else fma
        self.ima_active = out is not fma
        self.round_metrics = {**self.round_metrics, "ima-active": float(self.ima_active),
                              "ima-window": float(max((len(w) for w in self.windows.values()),
                                                      default=0))}
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["ima"] = {k: [copy(m) for m in w] for k, w in self.windows.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.windows = {int(k): deque((copy(m) for m in w), maxlen=self.P)
                        for k, w in state["ima"].items()}


_CLASSES: dict[type[FedsysStrategy], type[FedsysStrategy]] = {}


def ima_class(base: type[FedsysStrategy]) -> type[FedsysStrategy]:
    """The class "IMA on ``base``" (cached, so checkpoints and isinstance work)."""
    if base not in _CLASSES:
        cls = type(f"Ima{base.__name__}", (ImaMixin, base),
                   {"name": "ima", "base_name": base.name, "__doc__": ImaMixin.__doc__})
        _CLASSES[base] = cls
    return _CLASSES[base]


def ima_strategy(cfg: RunConfig) -> FedsysStrategy:
    """Build ``ima.base`` with IMA on top (the registry entry of ``strategy: ima``)."""
    from strategies import BASES

    return ima_class(BASES[cfg.ima__base])(cfg)


__all__ = ["ImaMixin", "ima_class", "ima_strategy"]
