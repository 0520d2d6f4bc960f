"""Differential privacy composed with a fedsys strategy (issue 42 item 3; issue 65): updates
clipped to an L2 norm C (by the server, or by the clients and checked by the server),
Gaussian noise of std z C on their sum, and the (epsilon, delta) spent, from the RDP
accountant of Google's ``dp_accounting`` (:mod:`fedsys.dp`, which holds the mechanism and
why the accountant's noise multiplier is z / 2), as the round metric ``dp-epsilon``.

A :class:`~strategies.wrapper.StrategyWrapper` holding the strategy it makes private::

    strategy = DP(FedAvgStrategy(clients_per_round=10, num_partitions=100),
                  noise_multiplier=1.0, clipping_norm=1.0)

``strategy: dp`` with ``dp.base: <strategy>`` builds the same from a run config.  What is
released follows from what the method declares (its ``traits``, :class:`strategies.wrapper.Traits`:
how a round asks its clients), not from its name; per method:

- FedAvg, FedProx, FedAdam/FedYogi (before the server step), parallel FedELMY, one-shot
  FedAvg without its warm-up hop: the model sent plus the sum of the round's accepted
  clipped updates and N(0, (zC)^2), over the m clients asked (DP-FedAvg's fixed
  denominator: a refused or missing client counts as an update of 0); accounted as m
  sampled without replacement from the pool the round drew from, the connected sites, at
  most ``num-clients`` (issue 75 item 7a: with 10 of 100 sites connected every round takes
  the same 10; a WARNING says when the pool is below ``num-clients``); the parallel plans
  ask every client: no amplification;
- FedSeq, FedELMY's chain (any method that asks one client per hop): a hop releases one
  client's clipped model plus N(0, (zC)^2); a
  client is in one hop per pass, so each pass begun is one release for it, whether its
  hop ran or was skipped (no amplification; issue 75 item 7b);
- integer buffers (BatchNorm's ``num_batches_tracked``) are neither clipped nor noised: a
  release carries the values of the model sent, said once (issue 75 item 7c);
- IMA on top (``ima.base: dp``) averages released models: post-processing, free.

Refused, one line each, in every order (:meth:`DP.inert_options`): a method that says why
DP does not describe its release (``Traits.private``: FedCDA, whose selection reads the
clients' raw cached models; FedCross, whose collaborator selection reads the raw uploads'
similarities, and one upload can be mixed into several of the K released slots, so a
client's influence is not one clipped update), a model a method sends past its wrappers
(``unwrapped``: one-shot FedAvg's warm-up hop, one client's model sent on without
noise), a robust rule with DP either way round (a median
of clipped updates moves by up to 2C when one client changes, the noise is sized for a
mean), any wrapper applied before DP (IMA's window would hold un-noised models), any
wrapper after it that screens or replaces the mean, and the ``estimators`` (raw client
models' distances and losses each round).

Under DP the reply bounds that compare one client with another (``max-update-ratio``, the
median rules of ``max-examples-ratio`` and ``max-weight-ratio``, ``max-weight-share``) are
off, with the reason logged: clipping bounds every update, and no client's update may decide
another's inclusion; a reply without the model it was sent is refused (fails closed).

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
from typing import Any

import numpy as np
from flwr.supercore import log

from fedsys import dp
from fedsys import protocol as proto
from fedsys.options import REGISTERED_STRATEGIES, ConfigError, option, parse_group
from fedsys.params import Params, distance
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate, Rejection
from strategies.wrapper import StrategyWrapper

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
    strategy : FedsysStrategy or StrategyWrapper
        The strategy made private (see :class:`~strategies.wrapper.StrategyWrapper`).
    **options
        :class:`DPOptions`'s fields (``base`` is only read by :meth:`from_config`).
    """

    name = "dp"
    Options = DPOptions

    def __init__(self, strategy: Any, **options: Any) -> None:
        self.options: DPOptions = parse_group(DPOptions, self.name, options)
        super().__init__(strategy)
        self.seed = 0
        self.population = 0
        #: The clients a round samples (``clients-per-round``; 0: no sampling to account).
        self.sampled = 0
        self.started = False
        #: The round's clients asked (the fixed denominator), those accepted, and the
        #: model they were all sent.
        self.asked = 0
        self.accepted = 0
        self.reference: Params | None = None
        self.releases = 0
        #: ``(pool, sample) -> releases``: each round's release under the rate of the pool
        #: its sample was drawn from (``(0, 0)``: no amplification), the accountant's input.
        self.ledger: dict[tuple[int, int], int] = {}
        #: A chain's passes begun at its latest release: a client's releases (issue 75 7b).
        self.passes = 0
        #: Releases of a checkpoint written before issue 75 (its rounds' pools unknown).
        self.legacy = 0
        self.clipped = 0.0
        self.std = 0.0
        self._released_round = 0
        self._nodes: Any = None
        self._pass_of: Callable[[int], tuple[int, int]] | None = None
        self._warned_pool = 0
        self._told_integers = False

    @classmethod
    def from_config(cls, cfg: Any, build: Callable[[str], Any] | None = None) -> Any:
        """As :meth:`StrategyWrapper.from_config`; ``estimators: true`` is refused (it
        releases the raw client models' distances and losses every round)."""
        if bool(getattr(cfg, "estimators", False)):
            raise ConfigError(_ESTIMATORS)
        return super().from_config(cfg, build)

    def on_start(self, num_rounds: int) -> None:
        """The accounting's population and sample, from what the method declares
        (``traits.asks``: a sample each round, every client at once, or one per hop of a
        chain); the strategy made private: no reply bound compares clients, the round's
        sample drawn secretly (unless ``dp.reproducible-noise``)."""
        strategy = self.engine
        self.seed = strategy.settings.seed
        traits = strategy.traits
        self.population = int(strategy.settings.num_partitions or 0)
        self.sampled = (int(strategy.settings.clients_per_round or 0)
                        if traits.asks == "sample" else 0)
        if strategy.replies.private is False:
            strategy.replies = replace(strategy.replies, private=True)
        nodes = strategy.nodes
        if nodes is not None:
            nodes.secret_draws = not self.options.reproducible_noise
        self._nodes = nodes
        # a chain's hop: its pass (each pass begun is one release of every client)
        self._pass_of = getattr(strategy, "where", None) if traits.chain else None
        if traits.chain and self._pass_of is None:
            raise ConfigError(f"[dp] {strategy.name} asks one client per hop (traits.asks='hop') "
                              f"but has no where(round) -> (pass, hop) for DP to count passes by")
        self.started = True

    def inert_options(self, num_rounds: int) -> list[str]:
        """The compositions whose release the accountant does not describe, in every order
        (one sentence each; none recommends another refused one)."""
        strategy = self.engine
        attached = list(strategy.wrappers)
        mine = attached.index(self) if self in attached else len(attached)
        out = [f"dp on {strategy.name}: {why}" for why in
               ([strategy.traits.private] if strategy.traits.private else [])
               + strategy.unwrapped()]
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
                # not the norm itself: it is the client's raw data, outside epsilon (75 7d)
                bad.append(Rejection(u.node_id, u.partition_id, f"update norm above "
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
        m = max(self.asked, self.accepted)
        if server_round != self._released_round:
            self._released_round = server_round
            self.releases += 1
            self._account(server_round, m)
        self.std = self.options.noise_multiplier * self.options.clipping_norm / m
        rng = (np.random.default_rng(derive_seed(self.seed, server_round, slot, NOISE_TAG))
               if self.options.reproducible_noise else dp.entropy_rng())
        out = dp.add_noise(dp.fixed_denominator_mean(model, self.reference, self.accepted, m),
                           self.std, rng)
        out, reset = dp.reset_integers(out, self.reference)
        if reset and not self._told_integers:
            self._told_integers = True
            log(INFO, "[dp] integer buffers %s are released as the model sent (not clipped or "
                "noised, the clients' values would be released raw: a local step count)",
                reset[:5])
        return out

    def _account(self, server_round: int, asked: int) -> None:
        """Book one release: a chain's pass (issue 75 item 7b), or the round's rate
        (:func:`pool_rate`, item 7a), with a WARNING the first time, and each time after,
        that the pool drawn from is smaller than any before and than ``num-clients``."""
        if self._pass_of is not None:
            self.passes = max(self.passes, self._pass_of(server_round)[0] + 1)
            return
        pool = int(getattr(self._nodes, "pool", 0) or 0)
        key = pool_rate(self.population, self.sampled, pool, asked)
        self.ledger[key] = self.ledger.get(key, 0) + 1
        if self.sampled and 0 < pool < self.population and (
                not self._warned_pool or pool < self._warned_pool):
            self._warned_pool = pool
            log(WARNING, "[dp] round %d: the sample of %d was drawn from %d connected of "
                "num-clients %d: epsilon is accounted at the rate %d/%d of that pool, not "
                "%d/%d (%s)", server_round, asked, pool, self.population, asked, pool,
                self.sampled, self.population,
                "no amplification: every connected client is in every such round"
                if key == (0, 0) else "each connected client is likelier to be sampled")

    def spent(self) -> float:
        """Epsilon at ``dp.delta`` after the releases so far: a chain's client is released
        once in each pass begun, skipped hops or not (issue 75 item 7b); a round's release
        at the rate of the pool its sample was drawn from (item 7a)."""
        o = self.options
        if self.engine.traits.chain:  # a client is in one hop per pass
            legacy = math.ceil(self.legacy / max(self.population, 1))
            return dp.epsilon(o.noise_multiplier, max(self.passes, legacy), o.delta)
        ledger = dict(self.ledger)
        if self.legacy:  # a checkpoint before issue 75: the config's rate, as it was counted
            key = pool_rate(self.population, self.sampled, self.population, self.sampled)
            ledger[key] = ledger.get(key, 0) + self.legacy
        return dp.epsilon_of(o.noise_multiplier, ledger, o.delta)

    def round_metrics(self) -> dict[str, float]:
        """``dp-epsilon`` (spent so far, at ``dp.delta``), ``dp-noise-std`` (per weight of
        the released model), ``dp-clipped`` (outside epsilon) and ``dp-reproducible-noise``
        (1: the noise came from the seed, the epsilon does not hold against a reader of it)."""
        return {"dp-epsilon": self.spent(), "dp-noise-std": self.std, "dp-clipped": self.clipped,
                "dp-reproducible-noise": float(self.options.reproducible_noise)}

    def own_summary(self) -> None:
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
        log(INFO, "[dp] max-update-ratio, the median rules of max-examples-ratio and "
            "max-weight-ratio, and max-weight-share are off: clipping to C bounds every update, "
            "and no client's update may decide another's inclusion")
        log(INFO, "[dp] released outside epsilon (round records, log): %s", ", ".join(dp.OUTSIDE_EPSILON))
        if not self.sampled and self.engine.traits.asks == "sample":
            log(WARNING, "[dp] no fixed clients-per-round: the accounting assumes no sampling "
                "amplification")

    def own_state(self) -> dict[str, Any]:
        """The releases so far (the accountant's input): their count, their pools and
        samples, a chain's passes."""
        return {"releases": self.releases, "passes": self.passes, "legacy": self.legacy,
                "ledger": [[p, m, n] for (p, m), n in sorted(self.ledger.items())]}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`own_state` output (one written before issue 75 holds only the
        count: its releases are accounted at the config's rate, as they were)."""
        self.releases = int(state.get("releases", 0))
        self.passes = int(state.get("passes", 0))
        self.ledger = {(int(p), int(m)): int(n) for p, m, n in state.get("ledger", [])}
        self.legacy = int(state.get("legacy", self.releases if "ledger" not in state else 0))


def pool_rate(population: int, sample: int, pool: int, asked: int) -> tuple[int, int]:
    """``(population, sample)`` for :func:`fedsys.dp.epsilon_of` of one round that asked
    ``asked`` clients drawn from a ``pool`` of connected ones (``pool`` 0: unknown, a round
    loop that does not draw through :class:`~strategies.nodes.NodeDirectory`).

    Without a fixed ``clients-per-round`` (``sample`` 0), in a parallel plan or without a
    ``num-clients`` (``population`` 0): ``(0, 0)``, no amplification.  Else the rate of
    the pool drawn from, ``asked / min(pool, population)``: a client in a pool of 10 is in every sample of 10 whatever the config's
    ``num-clients`` 100 says (issue 75 item 7a); a pool larger than ``num-clients`` (nodes
    keyed by their ids) is taken as ``num-clients``, never more amplification than the
    config declares.  ``(0, 0)`` when every client of the pool is asked."""
    if sample <= 0 or population <= 0:
        return 0, 0
    size, m = (min(pool, population), asked) if pool > 0 else (population, sample)
    return (0, 0) if m >= size else (size, m)


def _unusable(ref: Params | None, round_ref: Params | None) -> str:
    """Why DP cannot clip an update sent ``ref`` in a round whose other accepted updates
    were sent ``round_ref`` (empty: it can)."""
    if ref is None:
        return "no record of the model it was sent to clip against: dp refuses it (fails closed)"
    if round_ref is not None and ref is not round_ref and distance(ref, round_ref) != 0.0:
        return "trained from another model than the round's other updates: dp's sum needs one"
    return ""


#: Why a wrapper cannot act before DP.
_BEFORE = {"ima": "IMA's window would hold un-noised models, each released again in later "
                  "rounds; put ima outside: ima.base=dp"}
_ROBUST = ("a robust rule's output moves by up to 2C when one client's clipped update changes "
           "(the median of v, -v, -v moves by 2C when the third becomes +v, a mean by 2C/3) and "
           "DP's noise is sized for a mean; no order of the two is accounted")
_ESTIMATORS = ("dp with estimators: true: the estimators release each round the raw client "
               "models' distances and their losses on client data, outside DP's noise")


__all__ = ["DP", "NOISE_TAG", "DPOptions", "pool_rate"]
