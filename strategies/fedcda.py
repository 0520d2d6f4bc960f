"""FedCDA (Wang et al., "FedCDA: Federated Learning with Cross-Round Divergence-Aware
Aggregation", ICLR 2024, Algorithm 1), on the fedsys base class.

The strategy orchestrates; the maths is in :mod:`fedsys.fedcda` and the per-client
model memory in :mod:`fedsys.model_cache`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any, ClassVar, Unpack

import numpy as np
from flwr.supercore import log

from fedsys import fedcda as maths
from fedsys.fedcda import Layout
from fedsys.model_cache import ModelCache
from fedsys.options import ConfigError, option
from fedsys.params import Params, mean
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.settings import RoundSettingsKw, checked_options

BATCH_TAG = 0xCDA


@dataclass(frozen=True)
class FedCDAOptions:
    """FedCDA's options (config keys ``fedcda.*``)."""

    memory: int = option(3, "FedCDA: K, recent local models cached per client.", bounds="> 0")
    batches: int = option(3, "FedCDA: B, greedy selection batches per round (Eq. 8); the "
                          "minimum: raised while one batch's search would exceed "
                          "fedcda.search-budget.", bounds="> 0")
    search_budget: int = option(
        4096, "FedCDA: most combinations (K^batch size) one Eq. 8 batch search may "
        "evaluate; the batch count rises to stay within it (4096 keeps the paper's "
        "B = 3 up to 20 clients per round at K = 3).", bounds="> 0")
    warmup: int = option(-1, "FedCDA: rounds run as FedAvg before selection starts; -1: a "
                         "quarter of the run (the paper's 50 of 200 rounds).", bounds=">= -1")
    warmup_fraction: float = option(
        0.0, "FedCDA: the warmup as a fraction of the run's rounds (floor(f*T); > 0 "
        "overrides fedcda.warmup).", bounds="[0, 1]")
    warmup_mode: str = option(
        "fedavg", "FedCDA warmup: 'fedavg' (paper) or 'newest-all' (uniform mean of every "
        "seen client's newest model, the public prototype's behaviour).",
        choices=("fedavg", "newest-all"))
    smoothness: float = option(1.0, "FedCDA: L, the smoothness constant of Eq. 5.",
                               bounds=">= 0")
    selection: str = option(
        "approximate", "FedCDA selection: approximate (Eq. 8), optimal (exhaustive Eq. 6 over "
        "all clients), newest, random (Fig. 2a ablation).",
        choices=("approximate", "optimal", "newest", "random"))
    cache: str = option(
        "ram", "FedCDA model cache: 'ram', or 'disk' (one file per cached model, "
        "memory-mapped when read, removed once no model or checkpoint needs it).",
        choices=("ram", "disk"))
    cache_dir: str = option(
        "", "FedCDA: directory of the disk cache (empty: <run>/<strategy>/fedcda-cache under "
        "fedsys run, else a temporary directory removed with the strategy).  In a deployment it "
        "must lie under the operator's FEDSYS_ROOTS.")


class FedCDAStrategy(FedsysStrategy):
    r"""Cross-round divergence-aware aggregation.

    Per client, keyed by the partition-id it reported first (its node id where it
    reports none), the server caches its K most recent local models with the
    last-epoch mean training loss it reported (Alg. 1 line 8; the metric
    ``train_loss_key`` names, Flower's ``train_loss`` by default).  Rounds ``1..fedcda.warmup`` are FedAvg (the cache fills
    meanwhile; ``fedcda.warmup-mode=newest-all`` instead averages the newest model of
    every client seen, as the public prototype does).  Afterwards every accepted
    participant's model is chosen from its cache by ``fedcda.selection``:

    * ``approximate`` (default): Eq. 8, the participants split into B seeded batches,
      each batch searched exhaustively with the earlier batches and all
      non-participants fixed and the later batches left out;
    * ``optimal``: Eq. 6 searched exhaustively over every seen client's cache jointly
      (K^N combinations; small cases only);
    * ``newest`` / ``random``: the Fig. 2(a) ablations.

    Non-participants and rejected participants keep their earlier selection.  The
    new global model is the uniform mean of the selected models of every client
    seen so far (Alg. 1 line 10, clients never seen left out, spec §6 item 1).
    Integer buffers take the element-wise maximum over the selected models.

    The sum of the selected vectors is kept in float64 and updated by the changed
    selections only, so a round costs O(P·K·C) (plus the batch searches), not
    O(N·C); with ``fedcda.cache=disk`` only metadata and that sum live in RAM.

    Parameters
    ----------
    memory, batches, search_budget, warmup, warmup_fraction, warmup_mode
        The method's options: :class:`FedCDAOptions`'s fields, each documented there with
        its type, default and bounds (the config keys ``fedcda.*``).
    smoothness, selection, cache, cache_dir
        Likewise.
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    name = "fedcda"
    default_trainer = "sgd"
    Options = FedCDAOptions
    foreign_model = ("it becomes the global model the round sends; the clients' cached "
                     "models stay, and the next aggregate draws on them as before")
    traits = Traits(asks="sample", mean="all", private=(
        "FedCDA's selection reads the clients' raw cached models, so its global model is not "
        "a function of the noised aggregates only"))
    required_metrics: ClassVar[dict[str, str]] = {
        "train_loss_key": "the mean training loss of the last local epoch, Alg. 1 line 8"}

    def __init__(self, *, memory: int = 3, batches: int = 3, search_budget: int = 4096,
                 warmup: int = -1, warmup_fraction: float = 0.0, warmup_mode: str = "fedavg",
                 smoothness: float = 1.0, selection: str = "approximate", cache: str = "ram",
                 cache_dir: str = "", **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: FedCDAOptions = checked_options(FedCDAOptions(
            memory=memory, batches=batches, search_budget=search_budget, warmup=warmup,
            warmup_fraction=warmup_fraction, warmup_mode=warmup_mode, smoothness=smoothness,
            selection=selection, cache=cache, cache_dir=cache_dir), self.prefix())
        o = self.options
        self.K = o.memory
        self.B = o.batches
        self.L = o.smoothness
        self.selection = o.selection
        self.warmup = o.warmup
        self._check_search_size()
        self.cache: ModelCache | None = None
        self.layout: Layout | None = None
        self.order: tuple[str, ...] = ()
        self.selected: dict[int, int] = {}  # client -> round of its selected entry
        self.sel_sum: np.ndarray | None = None  # float64 sum of selected vectors
        self.batches_used = self.B  # Eq. 8 batches of the last selection round

    def _check_search_size(self) -> None:
        """Refuse a search that cannot run (:func:`fedsys.fedcda.search_refusal`) or a
        cache directory that is a file."""
        why = maths.search_refusal(self.selection, self.K, self.options.search_budget,
                                   self.settings.num_partitions)
        if why is not None:
            raise ConfigError(why)
        d = Path(self.options.cache_dir).expanduser() if self.options.cache_dir else None
        if d is not None and d.exists() and not d.is_dir():
            raise ConfigError(f"fedcda.cache-dir={self.options.cache_dir} exists and is not a "
                              "directory")

    def on_start(self, num_rounds: int) -> None:
        """A warmup given as a fraction becomes ``floor(fraction * num_rounds)`` rounds;
        unset (-1), a quarter of the run, as the paper's 50 of 200."""
        if self.options.warmup_fraction > 0:
            self.warmup = int(self.options.warmup_fraction * num_rounds)
        elif self.options.warmup < 0:
            self.warmup = num_rounds // 4

    def method_schedule_keys(self) -> list[str]:
        """The warmup, given as a fraction of the run or unset (a quarter of it)."""
        if self.options.warmup_fraction > 0:
            return ["fedcda.warmup-fraction"]
        return ["fedcda.warmup (unset: a quarter of the run)"] if self.options.warmup < 0 else []

    def branch_refusal(self) -> str | None:
        """The disk cache (``fedcda.cache: disk``) lives in the parent's run directory:
        a branch would share its files."""
        if self.options.cache == "disk":
            return ("FedCDA's disk cache lives in the parent's run directory; branch with "
                    "fedcda.cache: ram")
        return None

    def inert_options(self, num_rounds: int) -> list[str]:
        """A warmup covering every round leaves FedCDA as FedAvg."""
        if self.warmup < num_rounds:
            return []
        o = self.options
        key = (f"fedcda.warmup-fraction={o.warmup_fraction:g}" if o.warmup_fraction > 0
               else f"fedcda.warmup={o.warmup}")
        return [f"{key} makes the FedAvg warmup {self.warmup} rounds, the whole run of "
                f"{num_rounds}: FedCDA would never select; lower it (unset, the warmup is a "
                "quarter of the run)"]

    def summary(self) -> None:
        """Log K, B, L, the warmup and the selection rule."""
        super().summary()
        log(INFO, "[%s] K=%d, B=%d, L=%g, warmup=%d (%s), selection=%s, cache=%s",
            self.label, self.K, self.B, self.L, self.warmup,
            self.options.warmup_mode, self.selection, self.options.cache)

    # ------------------------------------------------------------------ set-up

    def _cache_directory(self, saved: str | None = None) -> Path | None:
        """Where the disk cache lives: ``fedcda.cache-dir`` (``fedsys run`` gives its own
        under the strategy's results directory), else the directory a checkpoint names, else
        a temporary one removed with the strategy; ``None`` for the RAM cache."""
        if self.options.cache != "disk":
            return None
        if self.options.cache_dir:
            return Path(self.options.cache_dir).expanduser()
        if saved:
            return Path(saved)
        directory = Path(tempfile.mkdtemp(prefix="fedsys-fedcda-cache-"))
        weakref.finalize(self, shutil.rmtree, directory, True)
        log(INFO, "[%s] disk cache in %s (removed with the strategy; set fedcda.cache-dir "
            "to choose)", self.label, directory)
        return directory

    def _ensure(self, like: Params) -> tuple[ModelCache, Layout]:
        if self.layout is None:
            self.layout = Layout.of(like)
            self.order = tuple(like)
        if self.cache is None:
            self.cache = ModelCache(self.K, self._cache_directory())
        if self.sel_sum is None:
            self.sel_sum = np.zeros(self.layout.dim)
        return self.cache, self.layout

    # ------------------------------------------------------------------ round

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """Alg. 1 lines 8-10: cache the uploads, select per client (Eq. 8 or an
        ablation), average every seen client's selection; FedAvg during the warmup."""
        cache, layout = self._ensure(updates[0].params)
        cache.new_pass()  # the disk store checks each file this round reads, once
        assert self.sel_sum is not None
        t0 = time.perf_counter()
        participants = [u.partition_id for u in updates]
        # Participants are selected afresh: take their old selections out of the sum.
        for n in participants:
            if n in self.selected:
                self.sel_sum -= cache.vector(n, self.selected[n])
        for u in updates:
            vec, ints = layout.pack(u.params)
            loss = float(u.metrics[self.settings.train_loss_key])
            cache.add(u.partition_id, server_round, vec, loss, maths.sq_norm(vec[: layout.d_obj]),
                      ints, owned=True)
        warm = server_round <= self.warmup
        info: dict[str, float] = {}
        if warm or self.selection == "newest":
            chosen = {n: server_round for n in participants}
        elif self.selection == "random":
            rng = np.random.default_rng(derive_seed(self.settings.seed, server_round, BATCH_TAG))
            chosen = {n: int(rng.choice([e.round for e in cache.of(n)])) for n in participants}
        elif self.selection == "approximate":
            chosen, info = self._approximate(server_round, participants)
        else:
            chosen, info = self._optimal(participants)
        self.selected.update(chosen)
        if self.selection == "optimal" and not warm:
            self._resum()
        elif self.selection == "approximate" and not warm:
            # _approximate left the new sum's objective part in self.sel_sum already
            for n, r in chosen.items():
                self.sel_sum[layout.d_obj :] += cache.vector(n, r)[layout.d_obj :]
        else:
            for n, r in chosen.items():
                self.sel_sum += cache.vector(n, r)
        metrics = self._round_metrics(server_round, participants, warm, info, time.perf_counter() - t0)
        if warm and self.options.warmup_mode == "fedavg":
            new = self.average(server_round, [u.params for u in updates],
                               [u.num_examples for u in updates])
        else:  # Alg. 1 line 10: the selected models' mean, from the running sum
            new = self.average(server_round, self.selected_models, own=self.global_model)
        return Aggregate(new, metrics)

    def _fixed_sums(self, clients: list[int]) -> tuple[float, float]:
        assert self.cache is not None
        sq = sum(self.cache.entry(n, self.selected[n]).sq for n in clients)
        loss = sum(self.cache.entry(n, self.selected[n]).loss for n in clients)
        return float(sq), float(loss)

    def _approximate(self, server_round: int, participants: list[int]) -> tuple[dict[int, int], dict[str, float]]:
        """Eq. 8: greedy batches, each searched exhaustively."""
        cache, layout = self.cache, self.layout
        assert cache is not None and layout is not None and self.sel_sum is not None
        pset = set(participants)
        fixed = [n for n in self.selected if n not in pset]
        vec_sum = self.sel_sum[: layout.d_obj]  # a view: participants already taken out
        sq_sum, loss_sum = self._fixed_sums(fixed)
        rng = np.random.default_rng(derive_seed(self.settings.seed, server_round, BATCH_TAG))
        chosen: dict[int, int] = {}
        combos = 0
        value = float("nan")
        batches = maths.adaptive_batches(len(participants), self.K, self.B,
                                         self.options.search_budget)
        if batches != self.batches_used:
            log(INFO, "[%s] round %d: %d participants, K=%d: %d Eq. 8 batches (fedcda.batches="
                "%d is the minimum; at most %d combinations per batch)", self.label,
                server_round, len(participants), self.K, batches, self.B,
                self.options.search_budget)
            self.batches_used = batches
        for batch in maths.split_batches(participants, batches, rng):
            ents = [cache.of(n) for n in batch]
            res = maths.search_batch(
                vec_sum, sq_sum, loss_sum, len(fixed),
                [[cache.vector(n, e.round)[: layout.d_obj] for e in es] for n, es in zip(batch, ents, strict=True)],
                [[e.loss for e in es] for es in ents],
                [[e.round for e in es] for es in ents],
                self.L,
            )
            combos += res.combinations
            value = res.value
            for n, es, k in zip(batch, ents, res.choice, strict=True):
                e = es[k]
                chosen[n] = e.round
                vec_sum += cache.vector(n, e.round)[: layout.d_obj]  # updates self.sel_sum
                sq_sum += e.sq
                loss_sum += e.loss
                fixed.append(n)
        return chosen, {"fedcda-combinations": combos, "fedcda-batches": batches,
                        "fedcda-last-batch-objective": value}

    def _optimal(self, participants: list[int]) -> tuple[dict[int, int], dict[str, float]]:
        """Exhaustive Eq. 6 over every seen client's cache jointly (the 'optimal' ablation)."""
        cache, layout = self.cache, self.layout
        assert cache is not None and layout is not None
        clients = cache.clients()
        ents = [cache.of(n) for n in clients]
        res = maths.search_batch(
            np.zeros(layout.d_obj), 0.0, 0.0, 0,
            [[cache.vector(n, e.round)[: layout.d_obj] for e in es] for n, es in zip(clients, ents, strict=True)],
            [[e.loss for e in es] for es in ents],
            [[e.round for e in es] for es in ents],
            self.L,
        )
        chosen = {n: es[k].round for n, es, k in zip(clients, ents, res.choice, strict=True)}
        return chosen, {"fedcda-combinations": res.combinations}

    def _resum(self) -> None:
        """Recompute the sum of selected vectors from scratch (after 'optimal' moved
        non-participants' selections too)."""
        assert self.cache is not None and self.layout is not None
        total = np.zeros(self.layout.dim)
        for n, r in sorted(self.selected.items()):
            total += self.cache.vector(n, r)
        self.sel_sum = total

    def selected_models(self) -> list[Params]:
        """Every seen client's selected model, as models (what :meth:`global_model`
        averages uniformly)."""
        assert self.cache is not None and self.layout is not None
        return [self.layout.unpack(self.cache.vector(n, r), self.cache.entry(n, r).ints, self.order)
                for n, r in sorted(self.selected.items())]

    def global_model(self) -> Params:
        """Uniform mean of every seen client's selected model (Alg. 1 line 10)."""
        assert self.cache is not None and self.layout is not None and self.sel_sum is not None
        m = len(self.selected)
        # integer buffers by the one rule of fedsys.params.mean (element-wise maximum)
        picked = [self.cache.entry(n, r).ints for n, r in sorted(self.selected.items())]
        ints = mean(picked) if self.layout.int_keys else {}
        return self.layout.unpack(self.sel_sum / m, ints, self.order)

    def _round_metrics(self, server_round: int, participants: list[int], warm: bool,
                       info: dict[str, float], seconds: float) -> dict[str, float]:
        cache, layout = self.cache, self.layout
        assert cache is not None and layout is not None and self.sel_sum is not None
        sel = sorted(self.selected.items())
        loss_sum = sum(cache.entry(n, r).loss for n, r in sel)
        sq_sum = sum(cache.entry(n, r).sq for n, r in sel)
        loss, div = maths.objective_terms(loss_sum, sq_sum, self.sel_sum[: layout.d_obj], len(sel), self.L)
        stale = sum(1 for n in participants if self.selected[n] != server_round)
        return {
            "fedcda-warmup": float(warm),
            "fedcda-objective": loss + div,
            "fedcda-loss-term": loss,
            "fedcda-divergence-term": div,
            "fedcda-earlier-models": float(stale),
            "fedcda-clients-in-mean": float(len(sel)),
            # the share of the mean trained this round (the rest are earlier rounds' models)
            "fedcda-fresh-fraction": sum(r == server_round for _, r in sel) / len(sel),
            "fedcda-aggregation-s": seconds,
            **info,
        }

    # ------------------------------------------------------------------ state

    def checkpoint_written(self) -> None:
        """Let a disk cache drop the files no checkpoint needs any more."""
        if self.cache is not None:
            self.cache.collect()

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the cache, the selections and their running sum."""
        state = super().state_dict()
        state["fedcda"] = {
            "layout": None if self.layout is None else self.layout.to_state(),
            "order": self.order,
            "selected": dict(self.selected),
            "sel_sum": None if self.sel_sum is None else self.sel_sum.copy(),
            "cache": None if self.cache is None else self.cache.state_dict(),
            "cache_dir": None if self.cache is None or self.cache.directory is None
            else str(self.cache.directory),
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a disk cache is reopened in ``fedcda.cache-dir``,
        else where the checkpoint says it was)."""
        super().load_state_dict(state)
        s = state["fedcda"]
        self.layout = (s["layout"] if s["layout"] is None or isinstance(s["layout"], Layout)
                       else Layout.from_state(s["layout"]))  # a Layout: a format-1 checkpoint
        self.order = tuple(s["order"])
        self.selected = {int(k): int(v) for k, v in s["selected"].items()}
        self.sel_sum = None if s["sel_sum"] is None else np.array(s["sel_sum"], dtype=np.float64)
        self.cache = None
        if s["cache"] is not None:
            directory = self._cache_directory(s["cache_dir"]) if s["cache_dir"] else None
            self.cache = ModelCache(int(s["cache"]["capacity"]), directory)
            self.cache.load_state_dict(s["cache"])
