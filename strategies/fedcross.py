"""FedCross (Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model
Cross-Aggregation", ICDE 2024, Algorithm 1), on the fedsys base class.

The strategy orchestrates: K persistent middleware models ("slots"), one per
sampled node, mixed after training.  The maths is in :mod:`fedsys.fedcross`.
Algorithm line numbers below are those of the rebuilt Algorithm 1 in the spec
(``fedcross.md`` §2.3); the seed text of the paper lost them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Unpack

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsys import fedcross as maths
from fedsys.options import ConfigError, option
from fedsys.params import Params, copy
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate
from strategies.base import SAMPLE_TAG, Aggregate, FedsysStrategy, Traits
from strategies.settings import RoundSettingsKw, checked_options

ASSIGN_TAG = 0xC055


@dataclass(frozen=True)
class FedCrossOptions:
    """FedCross's options (config keys ``fedcross.*``)."""

    alpha: float = option(0.99, "FedCross: cross-aggregation weight alpha "
                          "(w_i = a v_i + (1-a) v_c(i)).", bounds="(0, 1]")
    selection: str = option("lowest", "FedCross collaborative-model selection (CoModelSel).",
                            choices=maths.SELECTION_RULES)
    similarity: str = option("flat", "FedCross similarity: 'flat' cosine over all trainable "
                             "parameters (paper) or 'layer-pairs' (the authors' code).",
                             choices=maths.SIMILARITIES)
    warmup: int = option(0, "FedCross: first rounds that reset every slot to the mean of the "
                         "uploads (the code's first_stage_bound).", bounds=">= 0")
    propeller_rounds: int = option(0, "FedCross: rounds (from the start) that use propeller "
                                   "models (0 = off).", bounds=">= 0")
    propellers: int = option(2, "FedCross: propeller models per slot (in-order offsets).",
                             bounds="> 0")
    propeller_beta: float = option(0.0, "FedCross: own-model weight with propellers "
                                   "(0 = 1/(P+1), equal weights).", bounds="[0, 1]")
    dynamic_alpha_rounds: int = option(
        0, "FedCross: rounds over which alpha rises linearly from 0.5 to fedcross.alpha, "
        "starting after the propeller rounds (0 = off).", bounds=">= 0")


#: ``fedcross-phase`` metric values.
PHASES = {"cross": 0.0, "warmup": 1.0, "propellers": 2.0, "single": 3.0}


class FedCrossStrategy(FedsysStrategy):
    r"""Multi-model cross-aggregation.

    The server keeps K = ``clients-per-round`` middleware models :math:`W = [w_0 ..
    w_{K-1}]`, all copies of the initial model (Alg. 1 line 1; spec §6 item 2), with
    fixed slot identities.  Each round (lines 3-6) the sampled nodes get a seeded
    random permutation of the slots, one slot each, and train it; the client is never
    told which slot it holds (§2.7, §6 item 15).  Then, among the slots whose upload
    was accepted (lines 7-12):

    .. math::

        c(i) = \mathrm{CoModelSel}(i, V), \qquad
        w_i \leftarrow \alpha v_i + (1 - \alpha) v_{c(i)},

    with the collaborator chosen by ``fedcross.selection`` (lowest / highest cosine
    similarity, ``fedcross.similarity`` flat or the code's layer pairs, or in order).
    The model evaluated and exported is :math:`\bar w = \frac{1}{K}\sum_i w_i`
    (line 13); it never goes back into training.

    Acceleration (spec §2.6), by 0-indexed round ``r = server_round - 1``:

    * ``r < fedcross.warmup``: every slot, including slots that got no upload this
      round, is reset to the uploads' uniform mean (the code's
      ``first_stage_bound``), so the warm-up ends with K identical copies;
    * ``r < fedcross.propeller-rounds``: propeller models, each upload mixed with P
      in-order peers (:func:`fedsys.fedcross.propeller_matrix`);
    * ``fedcross.dynamic-alpha-rounds = T``: alpha rises linearly from 0.5 to
      ``fedcross.alpha`` over T rounds that start after both the warm-up and the
      propeller rounds.

    Missing uploads (spec §6 items 4-5): with fewer nodes than K the remaining slots
    wait unchanged; a slot whose node failed or was rejected keeps its model bit for
    bit and is neither mixed nor a collaborator.  Selection and mixing run over the
    n accepted uploads (in slot order); a single upload is stored as it is.  The
    global model still averages all K slots.

    Resume: :meth:`state_dict` adds the K slots.  The slot permutation is drawn from
    ``derive_seed(seed, round, ASSIGN_TAG)`` over the sampled partition-ids, so it
    needs no saved RNG state and does not depend on Flower's node ids.

    K is ``clients_per_round``; a strategy built with ``fraction_train`` instead fixes
    K at the number of nodes sampled in its first round.  The wrappers (IMA) act on the
    changed slots after mixing (the ``Aggregate`` names them); the global model is then the
    mean of the K slots as the wrappers left them, which a robust rule replaces
    (:meth:`average`; in any wrapper order: issue 65 item A).

    Parameters
    ----------
    alpha, selection, similarity, warmup, propeller_rounds, propellers, propeller_beta
        The method's options: :class:`FedCrossOptions`'s fields, each documented there with
        its type, default and bounds (the config keys ``fedcross.*``).
    dynamic_alpha_rounds
        Likewise.
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`);
        ``clients_per_round`` (K) must be at least 2.
    """

    name = "fedcross"
    default_trainer = "sgd"
    Options = FedCrossOptions
    traits = Traits(asks="sample", mean="round", private=(
        "FedCross's collaborator selection reads the raw uploads' similarities and one upload "
        "can be mixed into several of the K released slots, so a client's influence is not "
        "one clipped update (no DP composition of FedCross is accounted)"))
    foreign_model = "every one of the K slot models restarts from it, as at round 1"

    def __init__(self, *, alpha: float = 0.99, selection: str = "lowest",
                 similarity: str = "flat", warmup: int = 0, propeller_rounds: int = 0,
                 propellers: int = 2, propeller_beta: float = 0.0, dynamic_alpha_rounds: int = 0,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: FedCrossOptions = checked_options(FedCrossOptions(
            alpha=alpha, selection=selection, similarity=similarity, warmup=warmup,
            propeller_rounds=propeller_rounds, propellers=propellers,
            propeller_beta=propeller_beta, dynamic_alpha_rounds=dynamic_alpha_rounds),
            self.prefix())
        if self.settings.clients_per_round is not None:
            self._set_k(self.settings.clients_per_round)
        else:
            self.K = 0
        self.slots: list[Params] = []
        #: node id -> slot, for the round being trained.
        self.assignment: dict[int, int] = {}
        #: Slots written by the last aggregation (read by IMA).
        self.last_updated_slots: list[int] = []

    def _set_k(self, k: int) -> None:
        if k < 2:
            raise ConfigError(
                "fedcross needs config key 'clients-per-round' >= 2 (one middleware model "
                f"per sampled node, each mixed with another), got {k}"
            )
        self.K = k

    def inert_options(self, num_rounds: int) -> list[str]:
        """alpha = 1 (without a dynamic ramp) mixes nothing; a warmup or propeller phase
        covering the run leaves no cross-aggregation round."""
        c = self.options
        out = []
        if c.alpha == 1.0 and c.dynamic_alpha_rounds == 0:
            out.append("fedcross.alpha=1 keeps every slot's own model (w_i = v_i): no "
                       "cross-aggregation, K models trained apart")
        if max(c.warmup, c.propeller_rounds) >= num_rounds:
            key = ("fedcross.warmup" if c.warmup >= c.propeller_rounds
                   else "fedcross.propeller-rounds")
            out.append(f"{key}={max(c.warmup, c.propeller_rounds)} covers the whole run of "
                       f"{num_rounds} rounds: no cross-aggregation round")
        return out

    def summary(self) -> None:
        """Log K, alpha, the selection rule and the acceleration settings."""
        super().summary()
        c = self.options
        log(INFO, "[%s] K=%s slots, alpha=%g, selection=%s, similarity=%s, warmup=%d, "
            "propellers=%d for %d rounds (beta=%s), dynamic alpha over %d rounds", self.label,
            self.K or "first round's", c.alpha, c.selection, c.similarity,
            c.warmup, c.propellers, c.propeller_rounds,
            c.propeller_beta or "1/(P+1)", c.dynamic_alpha_rounds)
        if c.alpha < 0.5:
            log(WARNING, "[%s] fedcross.alpha=%g < 0.5 weights the collaborator above the "
                "model itself (the paper's range is [0.5, 1))", self.label, c.alpha)

    # ------------------------------------------------------------------ dispatch

    def _ensure_slots(self) -> None:
        """K identical copies of the initial model (Alg. 1 line 1; spec §6 item 2)."""
        if not self.slots:
            assert self.params is not None
            self.slots = [copy(self.params) for _ in range(self.K)]

    def sample(self, grid: Grid, server_round: int, k: int | None, tag: int = SAMPLE_TAG) -> dict[int, int]:
        """Sample as the base class; for training also assign slots (Alg. 1 line 4).

        The nodes, ordered by partition-id, take the first ``len(chosen)`` entries of
        a seeded permutation of the K slots (a random subset when fewer than K nodes
        are connected; spec §6 item 4).
        """
        chosen = super().sample(grid, server_round, k if k is not None or not self.K else self.K,
                                tag)
        if tag == SAMPLE_TAG:
            if not self.K:
                self._set_k(len(chosen))
            self._ensure_slots()
            rng = np.random.default_rng(derive_seed(self.settings.seed, server_round, ASSIGN_TAG))
            perm = rng.permutation(self.K)
            nodes = sorted(chosen, key=lambda n: chosen[n])
            self.assignment = {n: int(perm[j]) for j, n in enumerate(nodes)}
        return chosen

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Sample nodes, assign them slots (Alg. 1 line 4) and send each its slot model."""
        self.assignment = {}
        return list(super().configure_train(server_round, arrays, config, grid))

    def adopt(self, params: Params) -> None:
        """A foreign model: the global model and every slot (:attr:`foreign_model`)."""
        self.params = params
        if self.slots:
            self.slots = [copy(params) for _ in range(self.K)]

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        """The slot model assigned to ``node_id`` (Alg. 1 line 6); nothing else."""
        return self.slots[self.assignment[node_id]]

    # ------------------------------------------------------------------ aggregation

    def phase(self, server_round: int) -> str:
        """``warmup``, ``propellers`` or ``cross`` for 1-based ``server_round``."""
        r = server_round - 1
        if r < self.options.warmup:
            return "warmup"
        if r < self.options.propeller_rounds:
            return "propellers"
        return "cross"

    def alpha(self, server_round: int) -> float:
        """Cross-aggregation weight of ``server_round`` (dynamic alpha, spec §2.6 item 3)."""
        c = self.options
        start = max(c.warmup, c.propeller_rounds)
        return maths.dynamic_alpha(server_round, c.alpha, start, c.dynamic_alpha_rounds)

    def mixing_matrix(self, phase: str, server_round: int, sim: maths.F64) -> maths.F64:
        """Mixing weights over the n uploads (slot order) for ``phase``.

        ``sim`` holds the uploads' similarities (``CoModelSel``, Alg. 1 line 10).
        """
        n = len(sim)
        if phase == "warmup":
            return np.full((n, n), 1.0 / n)
        if phase == "single":
            return np.ones((1, 1))
        if phase == "propellers":
            beta = self.options.propeller_beta or None  # 0: equal weights
            return maths.propeller_matrix(server_round, n, self.options.propellers, beta)
        collab = maths.select_collaborators(sim, self.options.selection, server_round)
        return maths.cross_matrix(collab, self.alpha(server_round))

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """Alg. 1 lines 7-13 over the accepted uploads; returns the mean of the K slots."""
        t0 = time.perf_counter()
        by_slot = {self.assignment[u.node_id]: u.params for u in updates
                   if u.node_id in self.assignment}
        ok = sorted(by_slot)
        if not ok:
            return Aggregate(None)
        # Z: the models now in each slot's place (uploads, or the waiting slot models)
        rows = [by_slot.get(i, self.slots[i]) for i in range(self.K)]
        sim, g = maths.similarity(rows, self.options.similarity)
        sub = sim[np.ix_(ok, ok)]
        phase = self.phase(server_round)
        if len(ok) == 1 and phase != "warmup":
            phase = "single"
        a = self.mixing_matrix(phase, server_round, sub)
        weights = np.eye(self.K)  # new slot i = sum_j weights[i, j] Z_j
        if phase == "warmup":  # every slot, with or without an upload, := mean of uploads
            ups = [by_slot[i] for i in ok]
            avg = self.average(server_round, ups, own=lambda: maths.uniform_mean(ups))
            for slot in self.slots:
                for key, v in avg.items():
                    np.copyto(slot[key], v)
            weights[:] = 0.0
            weights[:, ok] = 1.0 / len(ok)
            self.last_updated_slots = list(range(self.K))
            glob = maths.uniform_mean(self.slots)
        else:  # lines 11-13: mix into the uploading slots, then the mean of all K
            weights[np.ix_(ok, ok)] = a
            glob = maths.cross_aggregate(self.slots, by_slot, a)
            self.last_updated_slots = ok
        metrics = self._metrics(phase, a, sub, g, weights, ok, time.perf_counter() - t0)
        # the wrappers act on the changed slots; then the mean of all K (line 13)
        return Aggregate(glob, metrics, {i: self.slots[i] for i in self.last_updated_slots},
                         lambda rnd, slots, changed: self._global(rnd, slots, None if changed else glob))

    def _global(self, server_round: int, slots: dict[int, Params], mixed: Params | None) -> Params:
        """The global model (Alg. 1 line 13) once the wrappers have acted on ``slots``: the
        mean of the K slots (``mixed``: the one :func:`fedsys.fedcross.cross_aggregate`
        made, where no wrapper replaced a slot), which a robust rule may replace."""
        for i, m in slots.items():
            self.slots[i] = m
        return self.average(server_round, self.slots,
                            own=(lambda: mixed) if mixed is not None else None)

    def _metrics(self, phase: str, a: maths.F64, sub: maths.F64, g: maths.Gram,
                 new: maths.F64, ok: list[int], seconds: float) -> dict[str, float]:
        """Round metrics: phase, own weight, uploads, similarities and spreads.

        ``fedcross-mean-sim``: mean similarity between the uploads;
        ``fedcross-collab-sim``: mean similarity of each upload to the models it is
        mixed with; ``fedcross-upload-spread`` / ``fedcross-slot-spread``: mean
        distance of the uploads / of the K slots after mixing to their mean, over the
        trainable parameters (from the Gram matrix, :func:`fedsys.fedcross.spread`).
        """
        n = len(ok)
        own = float(np.mean(np.diag(a)))
        m: dict[str, float] = {
            "fedcross-phase": PHASES[phase],
            "fedcross-alpha": own,
            "fedcross-uploads": float(n),
            "fedcross-slot-spread": float(np.mean(maths.spread(g.shifted, new))),
            "fedcross-seconds": seconds,
        }
        if n > 1:
            off = ~np.eye(n, dtype=bool)
            peers = (a > 0) & off
            m["fedcross-mean-sim"] = float(sub[off].mean())
            m["fedcross-collab-sim"] = float(sub[peers].mean()) if peers.any() else float("nan")
            m["fedcross-upload-spread"] = float(np.mean(maths.spread(g.shifted, np.eye(self.K)[ok])))
        return {k: v for k, v in m.items() if np.isfinite(v)}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the K slot models (the assignment RNG is derived per round)."""
        state = super().state_dict()
        state["fedcross"] = {"K": self.K, "slots": [copy(s) for s in self.slots]}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; K must match."""
        super().load_state_dict(state)
        fc = state["fedcross"]
        if int(fc["K"]) != self.K:
            raise ValueError(f"checkpoint has {fc['K']} FedCross slots, but clients-per-round "
                             f"is {self.K}")
        self.slots = [copy(s) for s in fc["slots"]]
