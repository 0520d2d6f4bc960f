"""Differential privacy composed with a fedsys strategy (issue 42 item 3; issue 65): updates
clipped to an L2 norm C (by the server, or by the clients and checked by the server),
Gaussian noise of std z C on their sum, and the (epsilon, delta) spent, from the RDP
accountant of Google's ``dp_accounting`` (:mod:`fedsys.dp`, which holds the mechanism and
why the accountant's noise multiplier is z / 2), as the round metric ``dp-epsilon``.

A :class:`~strategies.wrapper.StrategyWrapper`; ``strategy: dp`` with ``dp.base: <strategy>``.
What is released, per method:

- FedAvg, FedProx, FedAdam/FedYogi (before the server step), parallel FedELMY, one-shot
  FedAvg without its warm-up hop: the model sent plus the sum of the round's accepted
  clipped updates and N(0, (zC)^2), over the m clients asked (DP-FedAvg's fixed
  denominator: a refused or missing client counts as an update of 0); accounted as m of
  ``num-clients`` sampled without replacement (the parallel plans ask every client:
  no amplification);
- FedSeq, FedELMY's chain: a hop releases one client's clipped model plus N(0, (zC)^2); a
  client is in one hop per pass, so a pass is one release for it (no amplification);
- IMA on top (``ima.base: dp``) averages released models: post-processing, free.

Refused, one line each, in every order (:meth:`DP.inert_options`): FedCDA (its selection
reads the clients' raw cached models), FedCross (its collaborator selection reads the raw
uploads' similarities, and one upload can be mixed into several of the K released slots,
so a client's influence is not one clipped update), one-shot FedAvg's warm-up hop (one
client's model sent on without noise), a robust rule with DP either way round (a median
of clipped updates moves by up to 2C when one client changes, the noise is sized for a
mean), any wrapper applied before DP (IMA's window would hold un-noised models), any
wrapper after it that screens or replaces the mean, and the ``estimators`` (raw client
models' distances and losses each round).

Under DP the reply bounds that compare one client with another (``max-update-ratio``, the
median rule of ``max-examples-ratio``, ``max-weight-share``) are off, with the reason
logged: clipping bounds every update, and no client's update may decide another's
inclusion; a reply without the model it was sent is refused (fails closed).

The noise and the round's sample of clients are drawn from the operating system's
entropy: the run's seed, in its config, checkpoints and results pages, cannot regenerate
them.  ``dp.reproducible-noise: true`` draws both from the seed, for experiments that must
repeat; the log, ``results.md`` and every round's record (``dp-reproducible-noise`` 1)
then say that the epsilon does not hold against whoever has read the seed.  So a DP run
resumed, branched or deployed is what it promises elsewhere (the same models, schedule,
accounting and records) except that the noise and the sample after the resume or branch
point, or in another runtime, are fresh draws; with ``dp.reproducible-noise: true`` it is
bit-identical as every other run.

Flower's own ``DifferentialPrivacyServerSideFixedClipping`` wraps a strategy through
``configure_train`` / ``aggregate_train`` under Flower's ``Strategy.start``: a fedsys
strategy inside it loses its own ``start`` (hops, resends, checkpoints), and Flower's
accounting accepts only Flower's ``FedAvg.aggregate_train``
(``tests/unit/test_dp.py`` shows both).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.supercore import log

from fedsys import dp
from fedsys import protocol as proto
from fedsys.options import REGISTERED_STRATEGIES, ConfigError, option, parse_group
from fedsys.params import Params, distance
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate, Rejection
from strategies.wrapper import StrategyWrapper, Wrapped

#: Strategies that relay one model along a chain.
CHAINS = ("fedseq", "fedelmy")
#: Strategies whose rounds ask every client at once (no sampling).
PARALLEL = ("oneshot-fedavg", "fedelmy-parallel")
#: Seeds the noise (with the run's seed, the round and the slot) under
#: ``dp.reproducible-noise`` only.
NOISE_TAG = 0xD9


@dataclass(frozen=True)
class DPOptions:
    """Differential privacy's options (config keys ``dp.*``)."""

    base: str = option("fedavg", "dp: the strategy whose released models are made private.",
                       choices=REGISTERED_STRATEGIES)
    mode: str = option("server", "dp: who clips the updates: server (fixed clipping on the "
                       "server) or client (the clients clip, the server refuses a longer update).",
                       choices=("server", "client"))
    noise_multiplier: float = option(1.0, "dp: z, the noise's standard deviation on the sum "
                                     "of the clipped updates over C.", bounds="> 0")
    clipping_norm: float = option(1.0, "dp: C, the L2 norm every update is clipped to.",
                                  bounds="> 0")
    delta: float = option(1e-5, "dp: the delta the reported epsilon is for.", bounds="(0, 1)")
    reproducible_noise: bool = option(
        False, "dp: draw the noise and the round's sample from the run's seed (experiments "
        "that must repeat): whoever has read the seed can regenerate the noise and subtract "
        "it, so the epsilon does not hold against them (said in the log, results.md and each "
        "round's dp-reproducible-noise); false: the operating system's entropy.")


class DP(StrategyWrapper):
    """Clipped updates, Gaussian noise on their sum, and the privacy spent (see the module
    docstring).

    Parameters
    ----------
    **options
        :class:`DPOptions`'s fields (``base`` is only read by :meth:`from_config`).
    """

    name = "dp"
    Options = DPOptions

    def __init__(self, **options: Any) -> None:
        self.options: DPOptions = parse_group(DPOptions, self.name, options)
        self.method = ""
        self.seed = 0
        self.population = 0
        self.sample = 0
        self.started = False
        #: The round's clients asked (the fixed denominator), those accepted, and the
        #: model they were all sent.
        self.asked = 0
        self.accepted = 0
        self.reference: Params | None = None
        self.releases = 0
        self.clipped = 0.0
        self.std = 0.0
        self._released_round = 0

    @classmethod
    def from_config(cls, cfg: Any, build: Callable[[str], Any] | None = None) -> Any:
        """As :meth:`StrategyWrapper.from_config`; ``estimators: true`` is refused (it
        releases the raw client models' distances and losses every round)."""
        if bool(getattr(cfg, "estimators", False)):
            raise ConfigError(_ESTIMATORS)
        return super().from_config(cfg, build)

    def on_start(self, strategy: Wrapped, num_rounds: int) -> None:
        """The accounting's population and sample; the strategy made private: no reply
        bound compares clients, the round's sample drawn secretly (unless
        ``dp.reproducible-noise``)."""
        self.method, self.seed = strategy.name, strategy.settings.seed
        self.population = int(strategy.settings.num_partitions or 0)
        self.sample = (0 if strategy.name in (*CHAINS, *PARALLEL)
                       else int(strategy.settings.clients_per_round or 0))
        replies: Any = getattr(strategy, "replies", None)
        if getattr(replies, "private", None) is False:  # a ReplyPolicy (strategies.replies)
            cast(Any, strategy).replies = replace(replies, private=True)
        nodes = getattr(strategy, "nodes", None)
        if nodes is not None:
            nodes.secret_draws = not self.options.reproducible_noise
        self.started = True

    def inert_options(self, strategy: Wrapped, num_rounds: int) -> list[str]:
        """The compositions whose release the accountant does not describe, in every order
        (one sentence each; none recommends another refused one)."""
        attached = list(getattr(strategy, "wrappers", []))
        mine = attached.index(self) if self in attached else len(attached)
        out = [f"dp on {strategy.name}: {_METHODS[strategy.name]}"] if strategy.name in _METHODS else []
        opts = getattr(strategy, "options", None)
        if strategy.name == "oneshot-fedavg" and int(getattr(opts, "warmup_epochs", 0)) > 0:
            out.append("dp on oneshot-fedavg: its warm-up hop sends one client's trained model to "
                       "every client without noise (chain.warmup-epochs=0 starts from the "
                       "server's model)")
        for i, w in enumerate(attached):
            if w is self:
                continue
            if w.name == "robust" or w.replaces_mean:
                out.append(f"dp with {w.name} (either order): {_ROBUST}")
            elif i < mine:
                why = _BEFORE.get(w.name, f"{w.name} would act on the un-noised models")
                out.append(f"dp.base={w.name}: DP must be applied first ({why})")
            elif type(w).screen is not StrategyWrapper.screen:
                out.append(f"{w.name} after dp: it screens the clients' updates, which DP's "
                           f"clipping alone must decide")
        if getattr(strategy, "estimator_fn", None) is not None:
            out.append(_ESTIMATORS)
        return out

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Client mode: the clipping norm every client clips its update to."""
        return ({proto.DP_CLIPPING_NORM: self.options.clipping_norm}
                if self.options.mode == "client" else {})

    def screen(self, updates: list[ClientUpdate], references: Mapping[int, Params]
               ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Clip (server) or check (client) every update against the model it was sent;
        every update then counts 1.  An update without that model, or trained from another
        model than the round's others, is refused (fails closed)."""
        if not self.started:
            raise ConfigError("[dp] the strategy was not prepared: call strategy.prepare("
                              "num_rounds) (start() does) before the first round, so that no "
                              "reply bound compares clients and the sample is drawn secretly")
        c, out, bad, clipped = self.options.clipping_norm, [], [], 0
        self.asked, self.reference = len(references), None
        for u in updates:
            ref = references.get(u.node_id)
            why = _unusable(ref, self.reference)
            if why:
                bad.append(Rejection(u.node_id, u.partition_id, why))
                continue
            assert ref is not None
            self.reference = self.reference if self.reference is not None else ref
            params, norm = dp.clip_update(u.params, ref, c)
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
        """The round's mean of the accepted clipped updates as the sum over the clients
        asked (:func:`fedsys.dp.fixed_denominator_mean`) plus N(0, (z C / m)^2): one
        release per round or hop."""
        if self.accepted == 0 or self.reference is None:
            return model
        if server_round != self._released_round:
            self._released_round = server_round
            self.releases += 1
        m = max(self.asked, self.accepted)
        self.std = self.options.noise_multiplier * self.options.clipping_norm / m
        rng = (np.random.default_rng(derive_seed(self.seed, server_round, slot, NOISE_TAG))
               if self.options.reproducible_noise else dp.entropy_rng())
        return dp.add_noise(dp.fixed_denominator_mean(model, self.reference, self.accepted, m),
                            self.std, rng)

    def spent(self) -> float:
        """Epsilon at ``dp.delta`` after the releases so far."""
        o = self.options
        if self.method in CHAINS:  # a client is in one hop per pass
            per = math.ceil(self.releases / max(self.population, 1))
            return dp.epsilon(o.noise_multiplier, per, o.delta)
        return dp.epsilon(o.noise_multiplier, self.releases, o.delta, self.population, self.sample)

    def round_metrics(self) -> dict[str, float]:
        """``dp-epsilon`` (spent so far, at ``dp.delta``), ``dp-noise-std`` (per weight of
        the released model), ``dp-clipped`` (outside epsilon) and ``dp-reproducible-noise``
        (1: the noise came from the seed, the epsilon does not hold against a reader of it)."""
        return {"dp-epsilon": self.spent(), "dp-noise-std": self.std, "dp-clipped": self.clipped,
                "dp-reproducible-noise": float(self.options.reproducible_noise)}

    def summary(self) -> None:
        """Log the mechanism, where its noise comes from, and what it leaves outside epsilon."""
        o = self.options
        log(INFO, "[dp] %s-side clipping to C=%g, noise N(0, (z C)^2) on the sum with z=%g, "
            "epsilon at delta=%g reported each round (dp-epsilon; dp_accounting RDP, "
            "replace-one, noise multiplier z/2: the sum moves by up to 2C)", o.mode,
            o.clipping_norm, o.noise_multiplier, o.delta)
        if o.reproducible_noise:
            log(WARNING, "[dp] dp.reproducible-noise: the noise and the round's sample are drawn "
                "from the run's seed; whoever has read the seed (config, checkpoints, results "
                "pages) can regenerate the noise and subtract it: the reported epsilon does not "
                "hold against them (experiments only)")
        else:
            log(INFO, "[dp] noise and the round's sample drawn from the operating system's "
                "entropy: resumed, branched or deployed, the run draws them afresh (not "
                "bit-identical); dp.reproducible-noise=true repeats them, voiding the epsilon "
                "against whoever has read the seed")
        log(INFO, "[dp] max-update-ratio, the median rule of max-examples-ratio and "
            "max-weight-share are off: clipping to C bounds every update, and no client's "
            "update may decide another's inclusion")
        log(INFO, "[dp] released outside epsilon (round records, log): %s", ", ".join(dp.OUTSIDE_EPSILON))
        if not self.sample and self.method not in (*CHAINS, *PARALLEL):
            log(WARNING, "[dp] no fixed clients-per-round: the accounting assumes no sampling "
                "amplification")

    def state_dict(self) -> dict[str, Any]:
        """The releases so far (the accountant's input)."""
        return {"releases": self.releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.releases = int(state.get("releases", 0))


def _unusable(ref: Params | None, round_ref: Params | None) -> str:
    """Why DP cannot clip an update sent ``ref`` in a round whose other accepted updates
    were sent ``round_ref`` (empty: it can)."""
    if ref is None:
        return "no record of the model it was sent to clip against: dp refuses it (fails closed)"
    if round_ref is not None and ref is not round_ref and distance(ref, round_ref) != 0.0:
        return "trained from another model than the round's other updates: dp's sum needs one"
    return ""


#: Methods whose release is not a function of the noised sum of clipped updates.
_METHODS = {
    "fedcda": "FedCDA's selection reads the clients' raw cached models, so its global model "
              "is not a function of the noised aggregates only",
    "fedcross": "FedCross's collaborator selection reads the raw uploads' similarities and one "
                "upload can be mixed into several of the K released slots, so a client's "
                "influence is not one clipped update (no DP composition of FedCross is "
                "accounted)",
}
#: Why a wrapper cannot act before DP.
_BEFORE = {"ima": "IMA's window would hold un-noised models, each released again in later "
                  "rounds; put ima outside: ima.base=dp"}
_ROBUST = ("a robust rule's output moves by up to 2C when one client's clipped update changes "
           "(the median of v, -v, -v moves by 2C when the third becomes +v, a mean by 2C/3) and "
           "DP's noise is sized for a mean; no order of the two is accounted")
_ESTIMATORS = ("dp with estimators: true: the estimators release each round the raw client "
               "models' distances and their losses on client data, outside DP's noise")


__all__ = ["DP", "NOISE_TAG", "DPOptions"]
