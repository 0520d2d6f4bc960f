"""The fedsys server base class, on Flower's message-API :class:`Strategy`.

What every fedsys strategy gets from :class:`FedsysStrategy`:

* a fresh ``RecordDict`` per node, built from :meth:`payload_for`, so a strategy
  that sends a different model to each node overrides one method;
* a round loop (:meth:`start`) that calls :meth:`run_round`; a strategy with a
  different loop (a sequential chain of single-node hops) overrides
  :meth:`run_round` and keeps checkpoints, metrics and evaluation;
* node sampling with its own seeded generator, by partition-id (node ids are
  random and change when a node restarts), and waiting for nodes with a timeout;
* validation of every reply (error replies, missing keys, shape or dtype
  mismatch, NaN or Inf): rejected replies are logged and the round goes on;
* server-side evaluation each round through ``evaluate_fn`` and per-round hooks
  (metrics, progress, checkpoints);
* :meth:`state_dict` / :meth:`load_state_dict` of the whole strategy state.

Subclasses implement :meth:`aggregate` (pure maths lives in :mod:`fedsys`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from fedsys import flwr_io
from fedsys.config import RunConfig
from fedsys.flwr_io import ClientUpdate, Rejection
from fedsys.params import Params, copy
from fedsys.task import derive_seed

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
RoundHook = Callable[["FedsysStrategy", dict[str, Any]], None]

SAMPLE_TAG = 0x5EED
EVAL_TAG = 0xE7A1


class NodesUnavailableError(RuntimeError):
    """Too few nodes connected within ``node-wait-timeout``."""


class FedsysStrategy(Strategy):
    """Base class of every fedsys strategy.

    Parameters
    ----------
    cfg : RunConfig
        The resolved run configuration.
    """

    name: ClassVar[str] = "base"
    default_trainer: ClassVar[str] = "sgd"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.round = 0
        self.params: Params | None = None
        self.node_pid: dict[int, int] = {}
        self.history: list[dict[str, Any]] = []
        self.hooks: list[RoundHook] = []
        self.last_rejections: list[Rejection] = []
        self.poll_interval = 0.1
        self._outbox: list[Message] = []
        self._payloads: dict[int, Params] = {}
        self._expected: dict[int, int] = {}
        self.workdir: Path | None = None
        self.round_metrics: dict[str, float] = {}
        self.last_updates: list[ClientUpdate] = []
        #: Optional per-round analysis (see ``estimators``): ``(round, updates, new
        #: global model) -> metrics``, set by the runner.
        self.estimator_fn: Callable[[int, list[ClientUpdate], Params], dict[str, float]] | None = None

    # ------------------------------------------------------------------ nodes

    def wait_for_nodes(self, grid: Grid, want: int) -> list[int]:
        """Return connected node ids once ``want`` are there.

        After ``node-wait-timeout`` seconds the round goes on with the nodes that are
        connected if there are at least ``min-available-clients``; otherwise
        :class:`NodesUnavailableError` is raised.  It never waits forever.
        """
        need = min(self.cfg.min_available_clients, want)
        t0 = time.monotonic()
        while len(ids := sorted(grid.get_node_ids())) < want:
            if time.monotonic() - t0 > self.cfg.node_wait_timeout:
                if len(ids) >= need:
                    log(WARNING, "[%s] %d of %d wanted nodes connected after %.0f s; going on",
                        self.name, len(ids), want, self.cfg.node_wait_timeout)
                    return ids
                raise NodesUnavailableError(
                    f"only {len(ids)} of {need} required nodes connected after "
                    f"{self.cfg.node_wait_timeout:.0f} s (node-wait-timeout, "
                    f"min-available-clients)"
                )
            time.sleep(0.2)
        return ids

    def refresh_partition_map(self, grid: Grid, node_ids: Iterable[int]) -> dict[int, int]:
        """Learn the partition-id of nodes not seen before through one QUERY round."""
        live = set(node_ids)
        self.node_pid = {n: p for n, p in self.node_pid.items() if n in live}
        new = sorted(live - set(self.node_pid))
        if new:
            msgs = [flwr_io.query_message(n) for n in new]
            replies, sent = flwr_io.send_and_receive(
                grid, msgs, self.cfg.round_timeout, self.poll_interval
            )
            for r in replies:
                instr = sent.get(r.metadata.reply_to_message_id)
                if instr is None or r.has_error() or not r.content.metric_records:
                    continue
                rec = next(iter(r.content.metric_records.values()))
                if "partition-id" in rec:
                    self.node_pid[instr.metadata.dst_node_id] = int(rec["partition-id"])  # type: ignore[arg-type]
                nparts = int(rec.get("num-partitions", self.cfg.num_clients))  # type: ignore[arg-type]
                if nparts != self.cfg.num_clients:
                    log(WARNING, "node %d holds partition %s of %d, but num-clients is %d: the "
                        "federation and the config disagree (flwr run: --federation-config "
                        "num-supernodes=%d)", instr.metadata.dst_node_id, rec.get("partition-id"),
                        nparts, self.cfg.num_clients, self.cfg.num_clients)
            for n in new:
                if n not in self.node_pid:
                    log(WARNING, "node %d did not say its partition-id; left out", n)
        return dict(self.node_pid)

    def sample(self, grid: Grid, server_round: int, k: int, tag: int = SAMPLE_TAG) -> dict[int, int]:
        """Pick ``k`` nodes (``{node_id: partition_id}``) with a seeded generator.

        The draw is over sorted partition-ids with ``default_rng(seed, round)``, so
        the same seed picks the same clients whatever node ids Flower assigned.
        """
        ids = self.wait_for_nodes(grid, k)
        pid_of = self.refresh_partition_map(grid, ids)
        by_pid = {p: n for n, p in sorted(pid_of.items())}
        pids = sorted(by_pid)
        if len(pids) < k:
            log(WARNING, "round %d: %d nodes known, %d wanted", server_round, len(pids), k)
        rng = np.random.default_rng(derive_seed(self.cfg.seed, server_round, tag))
        chosen = sorted(rng.choice(pids, size=min(k, len(pids)), replace=False).tolist())
        return {by_pid[p]: int(p) for p in chosen}

    # ------------------------------------------------------------------ config

    @property
    def trainer(self) -> str:
        return self.default_trainer if self.cfg.trainer == "auto" else self.cfg.trainer

    def trainer_extra(self) -> dict[str, float]:
        """Trainer hyperparameters sent as ``trainer.<key>`` (FedProx's mu, ...)."""
        return {"mu": self.cfg.fedprox__mu} if self.trainer == "fedprox" else {}

    def train_config(self, server_round: int) -> dict[str, object]:
        """The per-round instructions of local training."""
        c = self.cfg
        out: dict[str, object] = {
            "server-round": server_round,
            "trainer": self.trainer,
            "lr": self.client_lr(server_round),
            "local-epochs": c.local_epochs,
            "local-steps": c.local_steps,
            "batch-size": c.batch_size,
            "momentum": c.momentum,
            "weight-decay": c.weight_decay,
        }
        out.update({f"trainer.{k}": v for k, v in self.trainer_extra().items()})
        return out

    def client_lr(self, server_round: int) -> float:
        """Client learning rate of ``server_round``: ``lr * lr-decay^(round - 1)``
        (IMA adds its own late decay)."""
        return float(self.cfg.lr * self.cfg.lr_decay ** (server_round - 1))

    # ------------------------------------------------------------------ Flower API

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        """The model sent to one node (the global model; FedCross overrides)."""
        assert self.params is not None
        return self.params

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes and build one fresh train message per node."""
        if self.params is None:
            self.params = flwr_io.from_record(arrays)
        chosen = self.sample(grid, server_round, self.cfg.clients_per_round)
        cfg = {**dict(config), **self.train_config(server_round)}
        self._expected = chosen
        self._payloads = {n: self.payload_for(n, p, server_round) for n, p in chosen.items()}
        self._outbox = [
            flwr_io.message(n, MessageType.TRAIN, self._payloads[n], cfg) for n in chosen
        ]
        return list(self._outbox)

    def validate(self, replies: Iterable[Message]) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Split replies into usable updates and logged rejections."""
        replies = list(replies)
        sent = {m.metadata.message_id: m for m in self._outbox if m.metadata.message_id}
        ok: list[ClientUpdate] = []
        bad: list[Rejection] = []
        seen: set[int] = set()
        for r in replies:
            res = flwr_io.parse_train_reply(
                r, sent, self._expected,
                self._payloads.get(sent[r.metadata.reply_to_message_id].metadata.dst_node_id)
                if r.metadata.reply_to_message_id in sent else None,
            )
            if isinstance(res, ClientUpdate) and res.node_id in seen:
                res = Rejection(res.node_id, res.partition_id, "duplicate reply")
            (ok if isinstance(res, ClientUpdate) else bad).append(res)  # type: ignore[arg-type]
            seen.add(res.node_id)
        for node in flwr_io.missing_nodes(sent, replies):
            bad.append(Rejection(node, self._expected.get(node, -1), "no reply before round-timeout"))
        for rj in bad:
            log(WARNING, "[%s] rejected reply of client %d (node %d): %s",
                self.name, rj.partition_id, rj.node_id, rj.reason)
        self.last_rejections = bad
        return sorted(ok, key=lambda u: u.partition_id), bad

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        """Return the new global model from validated updates (subclasses)."""
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, aggregate the good ones, report train metrics."""
        updates, rejected = self.validate(replies)
        self.round_metrics = {}
        new = self.aggregate(server_round, updates) if updates else None
        if new is None:
            log(WARNING, "[%s] round %d: no usable update; model unchanged", self.name, server_round)
        else:
            self.params = new
            if self.estimator_fn is not None:
                self.round_metrics.update(self.estimator_fn(server_round, updates, new))
        self.last_updates = updates
        n = sum(u.num_examples for u in updates)
        metrics: dict[str, float | int] = {"clients-ok": len(updates), "clients-rejected": len(rejected)}
        if updates and n > 0:
            metrics["train-loss"] = sum(u.metrics.get("train-loss", 0.0) * u.num_examples for u in updates) / n
        metrics.update(self.round_metrics)
        return (flwr_io.to_record(new) if new is not None else None), flwr_io.metric_record(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on ``fraction-evaluate`` of the nodes (0: none)."""
        if self.cfg.fraction_evaluate <= 0:
            return []
        n = max(1, math.ceil(self.cfg.fraction_evaluate * len(list(grid.get_node_ids()))))
        chosen = self.sample(grid, server_round, n, tag=EVAL_TAG)
        cfg = {**dict(config), "server-round": server_round}
        return [flwr_io.message(nd, MessageType.EVALUATE, arrays, cfg) for nd in chosen]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Example-weighted mean of the clients' evaluation metrics."""
        good = [r for r in replies if not r.has_error() and r.content.metric_records]
        if not good:
            return None
        rows = [flwr_io.metrics_of(r.content) for r in good]
        n = sum(r.get("num-examples", 0.0) for r in rows)
        if n <= 0:
            return None
        keys = [k for k in ("eval-loss", "eval-acc") if all(k in r for r in rows)]
        return flwr_io.metric_record({k: sum(r[k] * r["num-examples"] for r in rows) / n for k in keys})

    def summary(self) -> None:
        """Log the strategy's settings."""
        c = self.cfg
        log(INFO, "[%s] %d rounds, %d of %d clients per round, trainer=%s, lr=%g, seed=%d",
            self.name, c.num_server_rounds, c.clients_per_round, c.num_clients,
            self.trainer, c.lr, c.seed)

    # ------------------------------------------------------------------ loop

    def run_round(self, grid: Grid, server_round: int, train_config: ConfigRecord) -> dict[str, float]:
        """One training round: configure, send, wait (with timeout), aggregate.

        A strategy with another loop (e.g. a chain of single-node hops) overrides
        this method and returns its round metrics.
        """
        assert self.params is not None
        msgs = list(self.configure_train(server_round, flwr_io.to_record(self.params), train_config, grid))
        replies, _ = flwr_io.send_and_receive(grid, msgs, self.cfg.round_timeout, self.poll_interval)
        _, metrics = self.aggregate_train(server_round, replies)
        return {k: float(v) for k, v in (metrics or {}).items()}  # type: ignore[arg-type]

    def train_hop(
        self, grid: Grid, server_round: int, node_id: int, partition_id: int, params: Params,
        extra_config: dict[str, object] | None = None,
    ) -> ClientUpdate | None:
        """Send ``params`` to one node, wait for its reply, validate it.

        The building block of sequential strategies (a chain of single-node hops,
        FedSeq / FedELMY): returns the validated update, or ``None`` after logging
        why the hop failed.
        """
        cfg = {**self.train_config(server_round), **(extra_config or {})}
        self._expected = {node_id: partition_id}
        self._payloads = {node_id: params}
        self._outbox = [flwr_io.message(node_id, MessageType.TRAIN, params, cfg)]
        replies, _ = flwr_io.send_and_receive(grid, self._outbox, self.cfg.round_timeout,
                                              self.poll_interval)
        ok, _ = self.validate(replies)
        return ok[0] if ok else None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run rounds ``self.round + 1 .. num_rounds`` (resumes after a checkpoint)."""
        num_rounds = num_rounds or self.cfg.num_server_rounds
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        if self.params is None:
            self.params = flwr_io.from_record(initial_arrays)
        self.summary()
        result = Result()
        if self.round == 0 and evaluate_fn is not None:
            res = evaluate_fn(0, flwr_io.to_record(self.params))
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
                self._emit({"round": 0, **{k: float(v) for k, v in res.items()}, "round-time": 0.0})  # type: ignore[arg-type]
        for rnd in range(self.round + 1, num_rounds + 1):
            t0 = time.monotonic()
            train = self.run_round(grid, rnd, train_config)
            record: dict[str, Any] = {"round": rnd, **train}
            fed = self.aggregate_evaluate(rnd, flwr_io.send_and_receive(
                grid, list(self.configure_evaluate(rnd, flwr_io.to_record(self.params), evaluate_config, grid)),
                self.cfg.round_timeout, self.poll_interval)[0])
            if fed is not None:
                result.evaluate_metrics_clientapp[rnd] = fed
                record.update({f"fed-{k}": float(v) for k, v in fed.items()})  # type: ignore[arg-type]
            if evaluate_fn is not None:
                res = evaluate_fn(rnd, flwr_io.to_record(self.params))
                if res is not None:
                    result.evaluate_metrics_serverapp[rnd] = res
                    record.update({k: float(v) for k, v in res.items()})  # type: ignore[arg-type]
            result.train_metrics_clientapp[rnd] = flwr_io.metric_record(train)
            self.round = rnd
            record["round-time"] = time.monotonic() - t0
            self._emit(record)
        result.arrays = flwr_io.to_record(self.params)
        return result

    def _emit(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        for hook in self.hooks:
            hook(self, record)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly."""
        return {
            "name": self.name,
            "round": self.round,
            "params": copy(self.params) if self.params is not None else None,
            "history": [dict(h) for h in self.history],
        }

    def checkpoint_written(self) -> None:
        """Called after a checkpoint holding :meth:`state_dict` was written
        (a disk cache may now drop files the previous checkpoint needed)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint is for strategy {state.get('name')!r}, not {self.name!r}")
        self.round = int(state["round"])
        self.params = copy(state["params"]) if state["params"] is not None else None
        self.history = [dict(h) for h in state["history"]]
