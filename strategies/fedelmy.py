"""Sequential FL on a Flower server: FedELMY's chain, FedSeq, and their one-shot
parallel baselines.

FedELMY (Wang et al., "One-Shot Sequential Federated Learning for Non-IID Data by
Enhancing Local Model Diversity", ACM MM 2024; spec ``fedelmy.md``): one model
travels through the clients one hop at a time (Alg. 1; ``chain.passes`` > 1 is the
few-shot ring of Alg. 2).  Flower is hub and spoke, so the server relays it (spec
§3): every hop sends the carried model to one node and takes back that node's pool
mean.  The first client of the first pass warms up first (``chain.warmup-epochs``);
the final model is the last hop's reply.  There is no server-side averaging.

* :class:`FedElmyStrategy` (``fedelmy``): the chain with the pool trainer
  (:mod:`clients.fedelmy`);
* :class:`FedSeqStrategy` (``fedseq``): the same chain, plain local training;
* :class:`OneShotFedAvgStrategy` (``oneshot-fedavg``): the first client warms up,
  then every client trains once from that start and the server takes the
  example-weighted mean;
* :class:`ParallelFedElmyStrategy` (``fedelmy-parallel``, Alg. 3, App. C): every
  client warms up its own model and builds its pool at once; the server averages
  the pool means uniformly.

A "round" of these strategies is one step of the plan: a hop of the chain (or the
warm-up and the parallel round of the parallel variants); how a chain runs, retries and
skips is :mod:`strategies.chain`'s.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

import strategies.client_metrics as client_metrics
from fedsys import protocol as proto
from fedsys.fedelmy import GRAD_RATIO, POOL_HELD
from fedsys.params import Params
from fedsys.seeding import derive_seed
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, Traits
from strategies.chain import ChainBrokenError, ChainOptions, ChainStrategy
from strategies.replies import Verdict

INIT_TAG = 0x1417


class FedElmyStrategy(ChainStrategy):
    """FedELMY's chain of single-node hops (see the module docstring).

    Built like a Flower strategy::

        FedElmyStrategy(passes=1, order="permutation", warmup_epochs=2).start(
            grid, initial_arrays, timeout=600, train_config=ConfigRecord({"lr": 1e-3}))

    ``num_rounds`` of :meth:`start` is not used: the chain has ``passes`` x nodes hops.
    """

    name = "fedelmy"
    default_trainer = "fedelmy"
    #: Whether the run has said that a client's pool learnt little (:meth:`on_updates`, once).
    held_warned = False
    names_trainer = True  # the pool (FedSeq's best-validation epoch): no key of Flower's says it

    def on_updates(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """One WARNING in the server's log, the first time in a run that a reply says its
        client's FedELMY pool stayed near the received model and learnt little (its
        ``pool-held`` metric, :func:`fedsys.fedelmy.pool_held`): in a deployment the
        client's own warning is on its SuperNode, not before the operator."""
        held = [u for u in updates if float(u.metrics.get(POOL_HELD, 0.0)) == 1.0]
        if not held or self.held_warned:
            return
        self.held_warned = True
        u = held[0]
        # under DP no client's gradient norms in the log (issue 75 item 7d): the ratio is left out
        ratio = ("its ratio to the loss's not logged under dp" if any(
            w.name == "dp" for w in self.wrappers)
            else f"{float(u.metrics.get(GRAD_RATIO, 0.0)):.2g} times the loss's")
        log(WARNING, "[%s] round %d: client %d's FedELMY pool stayed near the received model "
            "and learnt little (the distance terms' gradient %s while App. "
            "A's s stayed 1, or was off: fedelmy.scaling false); on a small model lower "
            "fedelmy.beta (docs/methods.md: 'FedELMY's pool on a small model'); the records' '%s' says "
            "which later hops were held too", self.label,
            rnd, u.partition_id, ratio, POOL_HELD)


class FedSeqStrategy(FedElmyStrategy):
    """FedSeq (Li & Lyu 2024): the same chain, plain local training (trainer
    ``fedseq``), the trained model passed on (spec §6.16)."""

    name = "fedseq"
    default_trainer = "fedseq"


class ParallelStrategy(FedElmyStrategy):
    """Base of the one-shot parallel baselines: a parallel round per pass."""

    #: Every client at once; the server's mean of the replies, which a robust rule may replace.
    traits = Traits(asks="all", mean="all")

    def parallel(self, grid: Grid, rnd: int, cfg: dict[str, Any]) -> Verdict:
        """Send the current model to every partition's node at once (each its own start
        where ``init-seed`` asks); the replies, judged (:meth:`train_nodes`)."""
        assert self.params is not None
        nodes = {n: p for p in self.pids if (n := self.node_of(grid, p)) is not None}
        settings = self.round_config(rnd, cfg)
        configs = {}
        for n, p in nodes.items():
            configs[n] = s = dict(settings)
            if proto.INIT_SEED in s:
                s[proto.INIT_SEED] = derive_seed(int(s[proto.INIT_SEED]), p)
        return self.train_nodes(grid, nodes, self.params, configs)

    def combine(self, rnd: int, updates: list[ClientUpdate]) -> Params:
        """The server's mean of the replies (:meth:`average`: a robust wrapper's rule)."""
        raise NotImplementedError

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """A parallel round's model: :meth:`combine` (the wrappers then act on it)."""
        return Aggregate(self.combine(server_round, updates))

    def parallel_step(self, grid: Grid, rnd: int, cfg: dict[str, Any], p: int) -> dict[str, Any]:
        """One parallel round: every client, then :meth:`combine`; its record and log as a
        round of Flower's API makes them (the engine's: a partition without a node counts as
        rejected)."""
        verdict = self.parallel(grid, rnd, cfg)
        ok = verdict.updates
        record: dict[str, Any] = {"pass": p + 1, "hop": 0, "client": -1,
                                  **client_metrics.train_metrics(ok, len(self.pids) - len(ok),
                                                                 self.settings.train_loss_key)}
        if not ok:
            self.log_unusable(rnd, verdict.refused)
            return record
        self.params = self.aggregated(rnd, ok).model
        self.on_updates(rnd, ok)
        self.add_client_metrics(record, verdict)
        record.update(self.privacy_metrics())
        return record

    def evaluate_now(self, rnd: int) -> bool:
        """Every step of a parallel plan is worth evaluating."""
        return True


class OneShotFedAvgStrategy(ParallelStrategy):
    """One-shot parallel FedAvg: the first client of the order warms up
    (``chain.warmup-epochs``, one step), then per pass every client trains once from
    the current model and the server takes the example-weighted mean (McMahan et
    al. 2017, Alg. 1, one round)."""

    name = "oneshot-fedavg"
    default_trainer = "fedseq"

    def unwrapped(self) -> list[str]:
        """The warm-up hop: one client's model sent on to every client as it is."""
        if self.options.warmup_epochs > 0:
            return ["its warm-up hop sends one client's trained model to every client without "
                    "noise (chain.warmup-epochs=0 starts from the server's model)"]
        return []

    def plan_length(self, n: int) -> int:
        """A warm-up step (when ``warmup-epochs`` > 0), then one round per pass."""
        return (1 if self.options.warmup_epochs > 0 else 0) + self.options.passes

    def run_round(self, grid: Grid, rnd: int, train_config: ConfigRecord) -> dict[str, Any]:
        """The warm-up hop, or a parallel round."""
        warm_steps = 1 if self.options.warmup_epochs > 0 else 0
        if rnd <= warm_steps:
            order = self.order_of(0)
            for pid in order:  # the warm-up moves on when a client fails
                cfg = {**self.hop_config(rnd, train_config, True), proto.LOCAL_EPOCHS: 0}
                verdict, tries, why = self.run_hop(grid, rnd, pid, cfg)
                if verdict is not None:
                    (upd,) = verdict.updates
                    self.params, self.warmed = upd.params, True
                    return {"pass": 0, "hop": 1, "client": pid, "clients-ok": 1,
                            "clients-rejected": 0, "hop-tries": tries,
                            proto.TRAINED_EXAMPLES: upd.metrics.get(proto.TRAINED_EXAMPLES, 0)}
                self.skip(rnd, f"warm-up on client {pid}", why)
            return {"pass": 0, "hop": 1, "client": -1, "clients-ok": 0, "clients-rejected": 1}
        return self.parallel_step(grid, rnd, dict(train_config), rnd - warm_steps - 1)

    def progress(self, record: dict[str, Any]) -> str:
        """``warm-up, client 3`` or ``pass 1/1, all clients``."""
        if int(record.get("pass", 0)) == 0:
            return f"warm-up, client {int(record['client'])}"
        return super().progress(record)

    def combine(self, rnd: int, updates: list[ClientUpdate]) -> Params:
        """FedAvg's example-weighted mean (Alg. 1)."""
        return self.average(rnd, [u.params for u in updates], [u.num_examples for u in updates])


class ParallelFedElmyStrategy(ParallelStrategy):
    """Parallel FedELMY (Alg. 3, App. C, the server-centred variant): in the first
    pass every client warms up its own model (its own random start with
    ``chain.own-init``) and builds its pool; the server averages the pool means
    uniformly.  Later passes start every client from that mean."""

    name = "fedelmy-parallel"
    default_trainer = "fedelmy"

    def plan_length(self, n: int) -> int:
        """One parallel round per pass."""
        return self.options.passes

    def run_round(self, grid: Grid, rnd: int, train_config: ConfigRecord) -> dict[str, Any]:
        """A parallel round (the first with warm-up and own starts)."""
        cfg = dict(train_config)
        if rnd == 1:
            cfg = self.hop_config(rnd, train_config, self.options.warmup_epochs > 0)
            if self.options.own_init:
                cfg[proto.INIT_SEED] = derive_seed(self.settings.seed, INIT_TAG)
        return self.parallel_step(grid, rnd, cfg, rnd - 1)

    def combine(self, rnd: int, updates: list[ClientUpdate]) -> Params:
        """Alg. 3's uniform mean of the pool means."""
        return self.average(rnd, [u.params for u in updates])


__all__ = ["ChainBrokenError", "ChainOptions", "FedElmyStrategy", "FedSeqStrategy",
           "OneShotFedAvgStrategy", "ParallelFedElmyStrategy"]
