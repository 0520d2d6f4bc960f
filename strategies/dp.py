"""Differential privacy composed with a fedsys strategy (issue 42 item 3): updates clipped
to an L2 norm C (by the server, or by the clients and checked by the server), Gaussian noise
on every model the strategy makes, and the (epsilon, delta) spent, from the RDP accountant of
Google's ``dp_accounting`` (:mod:`fedsys.dp`), as the round metric ``dp-epsilon``.

A :class:`~strategies.wrapper.StrategyWrapper`; ``strategy: dp`` with ``dp.base: <strategy>``.
The noise's standard deviation is ``z * C * s``, ``s`` the largest weight one clipped update
has in the released model, per method:

- FedAvg, FedProx, FedAdam/FedYogi (before the server step), one-shot FedAvg, parallel
  FedELMY: the uniform mean of the m accepted updates (DP-FedAvg's weights: every update
  counts 1), ``s = 1/m``; accounted as sampling without replacement of the round's clients
  from the population (``num-clients``);
- FedCross: a slot is ``alpha`` times its client's upload plus ``1 - alpha`` times its
  collaborator's, ``s = max(alpha, 1 - alpha)``, noise on every slot;
- FedSeq, FedELMY's chain: a hop releases one client's model, ``s = 1``; a client is in one
  hop per pass, so a pass is one release for it (no sampling amplification);
- IMA on top (``ima.base: dp``) averages released models: post-processing, free;
- refused: FedCDA (its selection reads the clients' raw cached models, so what it releases
  is not a function of the noised aggregates only), ``dp.base: ima`` (IMA's window would hold
  un-noised models) and ``dp.base: robust`` (a median's sensitivity is not C / m).

Flower's own ``DifferentialPrivacyServerSideFixedClipping`` wraps a strategy through
``configure_train`` / ``aggregate_train`` under Flower's ``Strategy.start``: a fedsys
strategy inside it loses its own ``start`` (hops, resends, checkpoints), and Flower's
accounting accepts only Flower's ``FedAvg.aggregate_train``
(``tests/unit/test_dp.py`` shows both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.supercore import log

from fedsys import dp
from fedsys import protocol as proto
from fedsys.options import REGISTERED_STRATEGIES, option, parse_group
from fedsys.params import Params
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate, Rejection
from strategies.wrapper import StrategyWrapper, Wrapped

#: Strategies that relay one model along a chain.
CHAINS = ("fedseq", "fedelmy")
#: Seeds the noise (with the run's seed, the round and the slot).
NOISE_TAG = 0xD9


@dataclass(frozen=True)
class DPOptions:
    """Differential privacy's options (config keys ``dp.*``)."""

    base: str = option("fedavg", "dp: the strategy whose released models are made private.",
                       choices=REGISTERED_STRATEGIES)
    mode: str = option("server", "dp: who clips the updates: server (fixed clipping on the "
                       "server) or client (the clients clip, the server refuses a longer update).",
                       choices=("server", "client"))
    noise_multiplier: float = option(1.0, "dp: z, the noise's standard deviation over the "
                                     "sensitivity C * s.", bounds="> 0")
    clipping_norm: float = option(1.0, "dp: C, the L2 norm every update is clipped to.",
                                  bounds="> 0")
    delta: float = option(1e-5, "dp: the delta the reported epsilon is for.", bounds="(0, 1)")


class DP(StrategyWrapper):
    """Clipped updates, Gaussian noise on the released models, and the privacy spent."""

    name = "dp"
    Options = DPOptions

    def __init__(self, **options: Any) -> None:
        self.options: DPOptions = parse_group(DPOptions, self.name, options)
        self.method = ""
        self.share = 1.0
        self.seed = 0
        self.population = 0
        self.sample = 0
        self.accepted = 0
        self.releases = 0
        self.clipped = 0.0
        self.std = 0.0
        self._released_round = 0

    def on_start(self, strategy: Wrapped, num_rounds: int) -> None:
        """The method's sensitivity share and the accounting's population and sample."""
        self.method, self.seed = strategy.name, strategy.seed
        self.population = int(getattr(strategy, "num_partitions", None) or 0)
        self.sample = int(getattr(strategy, "clients_per_round", None) or 0)
        if strategy.name == "fedcross":
            alpha = float(getattr(getattr(strategy, "options", None), "alpha", 1.0))
            self.share = max(alpha, 1.0 - alpha)

    def inert_options(self, strategy: Wrapped, num_rounds: int) -> list[str]:
        """The compositions whose release the accountant does not describe."""
        attached = list(getattr(strategy, "wrappers", []))
        others = attached[:attached.index(self)] if self in attached else []  # applied before DP
        why = {"fedcda": "FedCDA's selection reads the clients' raw cached models, so its "
                         "global model is not a function of the noised aggregates only"}
        out = [f"dp on {strategy.name}: {why[strategy.name]}"] if strategy.name in why else []
        out += [f"dp.base={w.name}: DP must be applied first (put {w.name} outside: "
                f"{w.name}.base=dp)" for w in others if w.name in ("ima", "robust")]
        return out

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Client mode: the clipping norm every client clips its update to."""
        return ({proto.DP_CLIPPING_NORM: self.options.clipping_norm}
                if self.options.mode == "client" else {})

    def screen(self, updates: list[ClientUpdate], references: Mapping[int, Params]
               ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Clip (server) or check (client) every update; every update then counts 1."""
        c, out, bad, clipped = self.options.clipping_norm, [], [], 0
        for u in updates:
            ref = references.get(u.node_id)
            params, norm = (u.params, 0.0) if ref is None else dp.clip_update(u.params, ref, c)
            if self.options.mode == "client" and norm > c * (1 + 1e-4):
                bad.append(Rejection(u.node_id, u.partition_id, f"update norm {norm:.4g} above "
                                     f"dp.clipping-norm {c:g}: the client did not clip"))
                continue
            clipped += norm > c
            out.append(replace(u, params=params, num_examples=1))
        self.accepted = len(out)
        self.clipped = clipped / len(out) if out else 0.0
        return out, bad

    def transform(self, server_round: int, slot: int, model: Params) -> Params:
        """Gaussian noise of std ``z C s`` on every model the strategy makes (one release
        per round or hop)."""
        if self.accepted == 0:
            return model
        if server_round != self._released_round:
            self._released_round = server_round
            self.releases += 1
        share = self.share if self.method in (*CHAINS, "fedcross") else 1.0 / self.accepted
        self.std = self.options.noise_multiplier * self.options.clipping_norm * share
        rng = np.random.default_rng(derive_seed(self.seed, server_round, slot, NOISE_TAG))
        return dp.add_noise(model, self.std, rng)

    def spent(self) -> float:
        """Epsilon at ``dp.delta`` after the releases so far."""
        o = self.options
        if self.method in CHAINS:  # a client is in one hop per pass
            per = math.ceil(self.releases / max(self.population, 1))
            return dp.epsilon(o.noise_multiplier, per, o.delta)
        return dp.epsilon(o.noise_multiplier, self.releases, o.delta, self.population, self.sample)

    def round_metrics(self) -> dict[str, float]:
        """``dp-epsilon`` (spent so far, at ``dp.delta``), ``dp-noise-std``, ``dp-clipped``."""
        return {"dp-epsilon": self.spent(), "dp-noise-std": self.std, "dp-clipped": self.clipped}

    def summary(self) -> None:
        """Log the mechanism."""
        o = self.options
        log(INFO, "[dp] %s-side clipping to C=%g, noise multiplier z=%g, epsilon at delta=%g "
            "reported each round (dp-epsilon)", o.mode, o.clipping_norm, o.noise_multiplier, o.delta)
        if not self.sample:
            log(WARNING, "[dp] no fixed clients-per-round: the accounting assumes no sampling "
                "amplification")

    def state_dict(self) -> dict[str, Any]:
        """The releases so far (the accountant's input)."""
        return {"releases": self.releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.releases = int(state.get("releases", 0))


__all__ = ["DP", "DPOptions"]
