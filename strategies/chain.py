"""A chain of single-node hops: the round shape of sequential FL on a Flower server
(FedELMY's chain, FedSeq, and the one-shot baselines' plans, :mod:`strategies.fedelmy`).

One model travels through the clients one hop at a time (FedELMY, Alg. 1; ``chain.passes``
> 1 is the few-shot ring of Alg. 2).  Flower is hub and spoke, so the server relays it
(spec ``fedelmy.md`` §3): every hop sends the carried model to one node and takes back
that node's model.  A "round" of a chain is one step of its plan.  The server keeps the
model after every hop: a checkpoint is written after each, the central evaluation runs
after each (``chain.evaluate: hop``) or after each pass, and a hop that fails, errs or
times out is tried ``chain.retries`` more times, then skipped (logged, kept in the
metrics), the chain going on from the last good model.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Unpack

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

import strategies.client_metrics as client_metrics
from fedsys import protocol as proto
from fedsys.chain import ORDERS, chain_order, parse_order_list
from fedsys.options import ConfigError, option
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.replies import Verdict
from strategies.settings import RoundSettingsKw, checked_options


class ChainBrokenError(RuntimeError):
    """More hops were skipped than ``chain.max-skipped`` allows."""


@dataclass(frozen=True)
class ChainOptions:
    """Options of the sequential strategies (config keys ``chain.*``)."""

    passes: int = option(1, "T: passes through the chain (1: one-shot, Alg. 1; more: the "
                         "few-shot ring of Alg. 2).", bounds=">= 1")
    order: str = option("index", "Visiting order: index (partition ids ascending, the "
                        "paper's experiments), permutation (seeded, §3.1), list "
                        "(chain.order-list).", choices=ORDERS)
    reshuffle: bool = option(False, "With order permutation: draw a new order every pass "
                             "(Alg. 2 keeps one).")
    order_list: str = option("", "With order list: partition ids in visiting order, "
                             "comma-separated (\"3,0,2,1\").")
    warmup_epochs: int = option(1, "E_w: plain cross-entropy epochs on the first client "
                                "before its own training, first pass only (moves to the "
                                "next client if that hop fails).", bounds=">= 0")
    evaluate: str = option("hop", "Central evaluation after every hop or after every pass.",
                           choices=("hop", "pass"))
    retries: int = option(1, "Tries of a failed hop (error, refused reply, timeout) before "
                          "it is skipped.", bounds=">= 0")
    max_skipped: float = option(0.5, "Stop the run when more than this share of a run's "
                                "hops was skipped.", bounds="[0, 1]")
    own_init: bool = option(True, "fedelmy-parallel: each client starts from its own "
                            "random model (Alg. 3); false: from the server's.")


class ChainStrategy(FedsysStrategy):
    """A chain of single-node hops (see the module docstring), built like a Flower
    strategy; ``num_rounds`` of :meth:`start` is not used: the chain has ``passes`` x
    nodes hops.

    Parameters
    ----------
    passes, order, reshuffle, order_list, warmup_epochs, evaluate, retries, max_skipped
        The chain's options: :class:`ChainOptions`'s fields, each documented there with its
        type, default and bounds (the config keys ``chain.*``).
    own_init
        Likewise (``fedelmy-parallel``'s).
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    Options = ChainOptions
    option_prefix = "chain"
    checkpoint_each_round = True
    #: One client per hop; the model relayed, no mean taken.
    traits = Traits(asks="hop", mean="none")

    def __init__(self, *, passes: int = 1, order: str = "index", reshuffle: bool = False,
                 order_list: str = "", warmup_epochs: int = 1, evaluate: str = "hop",
                 retries: int = 1, max_skipped: float = 0.5, own_init: bool = True,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: ChainOptions = checked_options(ChainOptions(
            passes=passes, order=order, reshuffle=reshuffle, order_list=order_list,
            warmup_epochs=warmup_epochs, evaluate=evaluate, retries=retries,
            max_skipped=max_skipped, own_init=own_init), self.prefix())
        if self.options.order == "list":
            try:
                given = parse_order_list(self.options.order_list)
            except ValueError as exc:
                raise ConfigError(f"config key 'chain.order-list': {exc}") from None
            n = self.settings.num_partitions or 0
            outside = [p for p in given if n and p >= n]
            if outside:
                raise ConfigError(f"config key 'chain.order-list': partitions {outside} do not "
                                  f"exist (num-clients {n}: 0..{n - 1})")
            if not self.settings.query_partitions:
                raise ConfigError("chain.order 'list' names partition-ids, which the chain "
                                  "must know before its first hop: pass query_partitions=True "
                                  "(the nodes' ClientApp must answer fedsys's query, as "
                                  "fedsys_launch.apps.client_app does)")
        self.pids: list[int] = []
        self.orders: list[list[int]] = []
        self.warmed = False
        self.skipped = 0

    # ------------------------------------------------------------------ plan

    def plan_length(self, n: int) -> int:
        """Rounds (steps) of the whole run with ``n`` clients."""
        return self.options.passes * n

    def prepare(self, num_rounds: int) -> None:
        """The schedule is the plan (``num_rounds`` is not used)."""
        super().prepare(self.plan_length(len(self.pids) or self.settings.num_partitions or 1))

    def order_of(self, pass_index: int) -> list[int]:
        """The visiting order of a pass (drawn when the pass starts, then kept)."""
        while len(self.orders) <= pass_index:
            o = self.options
            given = parse_order_list(o.order_list) if o.order == "list" else ()
            self.orders.append(chain_order(self.pids, o.order, self.settings.seed, len(self.orders),
                                           o.reshuffle, given))
        return self.orders[pass_index]

    def where(self, rnd: int) -> tuple[int, int]:
        """``(pass, hop)``, 0-based, of round ``rnd``."""
        n = len(self.pids)
        return (rnd - 1) // n, (rnd - 1) % n

    def progress(self, record: dict[str, Any]) -> str:
        """``pass 1/1, hop 7/10, client 3``."""
        if record.get("hop", 0) > 0:
            return (f"pass {int(record['pass'])}/{self.options.passes}, hop "
                    f"{int(record['hop'])}/{len(self.pids)}, client {int(record['client'])}")
        return f"pass {int(record.get('pass', 0))}/{self.options.passes}, all clients"

    def evaluate_now(self, rnd: int) -> bool:
        """Evaluate after this round (every hop, or the last hop of a pass)."""
        return self.options.evaluate == "hop" or rnd % len(self.pids) == 0 or rnd == self.num_rounds

    # ------------------------------------------------------------------ nodes

    def node_of(self, grid: Grid, key: int) -> int | None:
        """The connected node the plan's ``key`` names: the node that reported
        partition ``key``, or the node whose id is ``key`` (a node the chain knew by its
        node id when it drew its order); the map is refreshed when that node is gone
        (a restarted node has a new id)."""
        live = set(grid.get_node_ids())
        node = next((n for n in sorted(live) if self.nodes.key_of(n) == key or n == key), None)
        if node is None:
            keys = self.nodes.refresh(grid, live, self.label, self.round_timeout, self.poll_interval)
            node = next((n for n, k in keys.items() if k == key), None)
        return node

    def discover(self, grid: Grid) -> None:
        """Learn the partitions the chain visits (first start only; kept on resume): the
        connected nodes' keys (:meth:`NodeDirectory.key_of`: partition-ids with ``query_partitions``,
        else node ids, since no node has replied yet)."""
        if self.pids:
            return
        ids = self.nodes.wait(grid, self.settings.num_partitions or self.settings.min_available_nodes, self.label)
        keys = self.nodes.refresh(grid, ids, self.label, self.round_timeout, self.poll_interval)
        self.pids = sorted(set(keys.values()))
        self.num_rounds = self.plan_length(len(self.pids))

    # ------------------------------------------------------------------ steps

    def hop_config(self, rnd: int, train_config: ConfigRecord, warm: bool) -> dict[str, Any]:
        """The instruction's settings of one hop."""
        cfg: dict[str, Any] = dict(train_config)
        if warm:
            cfg[proto.WARMUP_EPOCHS] = self.options.warmup_epochs
        return cfg

    def run_hop(self, grid: Grid, rnd: int, pid: int, cfg: dict[str, Any]
                ) -> tuple[Verdict | None, int, str]:
        """One hop with its retries: ``(the verdict of its one update or None, tries, why
        it failed)``."""
        assert self.params is not None
        why = ""
        for attempt in range(1, self.options.retries + 2):
            node = self.node_of(grid, pid)
            if node is None:
                why = f"no connected node holds partition {pid}"
            else:
                verdict = self.train_hop(grid, rnd, node, pid, self.params, cfg)
                if verdict.updates:
                    return verdict, attempt, ""
                why = verdict.refused[0].reason if verdict.refused else "no reply"
            if attempt <= self.options.retries:
                log(WARNING, "[%s] round %d: client %d failed (%s); trying again", self.label,
                    rnd, pid, why)
        return None, self.options.retries + 1, why

    def run_round(self, grid: Grid, rnd: int, train_config: ConfigRecord) -> dict[str, Any]:
        """Round ``rnd`` of the plan: one hop of the chain."""
        p, h = self.where(rnd)
        pid = self.order_of(p)[h]
        warm = not self.warmed and p == 0 and self.options.warmup_epochs > 0
        verdict, tries, why = self.run_hop(grid, rnd, pid, self.hop_config(rnd, train_config, warm))
        record: dict[str, Any] = {"pass": p + 1, "hop": h + 1, "client": pid, "hop-tries": tries}
        key = self.settings.train_loss_key
        if verdict is None:
            self.skip(rnd, f"client {pid}", why)
            record.update({**client_metrics.train_metrics([], 1, key), "hop-skipped": 1,
                           **self.privacy_metrics()})
            return record
        (upd,) = verdict.updates
        self.warmed = self.warmed or warm
        self.params = self.aggregated(rnd, [upd]).model
        self.on_updates(rnd, [upd])
        record.update({**client_metrics.train_metrics([upd], 0, key), "hop-skipped": 0})
        if self.settings.train_metrics_aggr_fn is None:  # the one reply's numbers, exact
            record.update(client_metrics.reply_metrics(upd))
        else:
            self.add_client_metrics(record, verdict)
        record.update(self.privacy_metrics())
        return record

    def privacy_metrics(self) -> dict[str, float]:
        """The DP wrapper's round metrics (``dp-epsilon``, :mod:`strategies.dp`) for a
        step's record, a skipped hop's too (the epsilon stands).  A chain's records held
        none before issue 75; other wrappers' metrics stay out of them, so a run without
        DP keeps its records as they were."""
        return {k: v for w in self.wrappers if w.name == "dp" for k, v in w.round_metrics().items()}

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """A hop's model: its one client's, relayed (the wrappers then act on it)."""
        return Aggregate(updates[0].params)

    def on_updates(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """Called with a step's accepted updates (nothing here; FedELMY's pool check)."""

    def skip(self, rnd: int, what: str, why: str) -> None:
        """Log and count a skipped step; stop the run past ``chain.max-skipped``."""
        self.skipped += 1
        log(WARNING, "[%s] round %d: %s skipped after %d tries (%s); the chain goes on from "
            "the last good model", self.label, rnd, what, self.options.retries + 1, why)
        if self.skipped > self.options.max_skipped * self.num_rounds:
            raise ChainBrokenError(
                f"[{self.label}] {self.skipped} of {self.num_rounds} steps skipped, more than "
                f"chain.max-skipped={self.options.max_skipped:g} allows")

    # ------------------------------------------------------------------ loop

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        """Not for a chain: it learns its partitions, sends hop by hop, retries and skips
        inside :meth:`start`; a round loop of the caller's own is refused saying so."""
        raise RuntimeError(
            f"[{self.label}] a chain runs its hops inside start() (one node at a time, with "
            f"retries and skips); a round loop of your own calling configure_train and "
            f"aggregate_train cannot run it: call strategy.start(grid, initial_arrays, ...)")

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the chain's partitions, orders, warm-up and skips."""
        return {**super().state_dict(), "chain": {
            "pids": list(self.pids), "orders": [list(o) for o in self.orders],
            "warmed": self.warmed, "skipped": self.skipped}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        super().load_state_dict(state)
        c = state["chain"]
        self.pids = [int(p) for p in c["pids"]]
        self.orders = [[int(p) for p in o] for o in c["orders"]]
        self.warmed, self.skipped = bool(c["warmed"]), int(c["skipped"])
        if self.pids:
            self.num_rounds = self.plan_length(len(self.pids))

    def summary(self) -> None:
        """Log the chain's settings and its first order."""
        log(INFO, "[%s] trainer=%s, seed=%d, options %s", self.label, self.trainer, self.settings.seed,
            self.options)
        log(INFO, "[%s] %d clients, %d steps; order of pass 1: %s", self.label, len(self.pids),
            self.num_rounds, self.order_of(0))


__all__ = ["ChainBrokenError", "ChainOptions", "ChainStrategy"]
