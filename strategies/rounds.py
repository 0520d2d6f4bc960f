"""The round engine under every fedsys strategy: Flower's message API
(``configure_train``, ``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``),
one training round with its resends (:meth:`RoundEngine.run_round`) and a chain's hop
(:meth:`RoundEngine.train_hop`); the loop of rounds is :class:`strategies.loop.RoundLoop`,
which :meth:`strategies.base.FedsysStrategy.start` runs.

It works on the parts a strategy is made of, each in a module of its own: the nodes and
which a round samples (:class:`strategies.nodes.NodeDirectory`), one exchange of messages
with its resends and traffic (:mod:`strategies.exchange`), which replies are usable (the
reply pipeline, :mod:`strategies.replies`, under the strategy's
:class:`~strategies.replies.ReplyPolicy`) and what a round reports of them
(:mod:`strategies.client_metrics`), all handed in by the strategy's constructor.
What a method decides, it asks through the hooks below (:meth:`~RoundEngine.aggregate`,
:meth:`~RoundEngine.payload_for`, :meth:`~RoundEngine.sample`, ...), which
:class:`strategies.base.FedsysStrategy` implements with the options, the wrappers and the
state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from logging import ERROR, INFO, WARNING
from typing import Any, ClassVar, Self

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.exception import AggregationError
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

import strategies.client_metrics as client_metrics
import strategies.exchange as exchange_ops
import strategies.replies as pipeline
from fedsys import protocol as proto
from fedsys.options import ConfigError
from fedsys.params import Params, distance
from fedsys.validation import ClientUpdate
from strategies.client_metrics import MetricsAggrFn
from strategies.exchange import Exchange, Traffic
from strategies.nodes import EVAL_TAG, SAMPLE_TAG, NodeDirectory
from strategies.replies import ReplyPolicy, RoundView, Verdict, why_refused
from strategies.wrapper import WrapperChain


class RoundEngine(Strategy):
    """Flower's :class:`Strategy` API and the round loop over a strategy's parts.

    Parameters
    ----------
    nodes : NodeDirectory
        Who the nodes are and which a round samples.
    replies : ReplyPolicy
        Which train replies are usable (the reply pipeline's settings).
    clients_per_round, fraction_evaluate, min_evaluate_nodes, transport_retries
        As :class:`strategies.base.FedsysStrategy`'s keywords of the same names.
    train_loss_key, weighted_by_key, arrayrecord_key, configrecord_key
        As :class:`strategies.base.FedsysStrategy`'s (Flower's names and defaults).
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn : MetricsAggrFn, optional
        As Flower's strategies (:func:`strategies.client_metrics.client_metrics`,
        :func:`strategies.client_metrics.evaluate_mean`).
    trainer, lr_decay
        The client trainer each instruction names and the learning rate's decay a round
        (:meth:`round_config`).
    """

    #: The method's name: its registry key and config-key prefix, in the logs and checkpoints.
    name: ClassVar[str] = "base"

    def __init__(self, *, nodes: NodeDirectory, replies: ReplyPolicy,
                 clients_per_round: int | None, fraction_evaluate: float,
                 min_evaluate_nodes: int, transport_retries: int, train_loss_key: str,
                 weighted_by_key: str, arrayrecord_key: str = proto.ARRAYS,
                 configrecord_key: str = proto.CONFIG,
                 train_metrics_aggr_fn: MetricsAggrFn | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggrFn | None = None,
                 trainer: str = "sgd", lr_decay: float = 1.0) -> None:
        #: The name a run gives this strategy (its results directory), used in the logs.
        self.run_label = ""
        self._told: set[str] = set()  # what tell_once has told
        self.nodes = nodes
        self.replies = replies
        self.clients_per_round = clients_per_round
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.transport_retries = int(transport_retries)
        self.train_loss_key = str(train_loss_key)
        self.weighted_by_key = str(weighted_by_key)
        self.arrayrecord_key = str(arrayrecord_key)
        self.configrecord_key = str(configrecord_key)
        self.train_metrics_aggr_fn = train_metrics_aggr_fn
        self.trainer = trainer
        self.lr_decay = float(lr_decay)
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn
        self.num_rounds = 0
        self.round_timeout = 3600.0
        self.round = 0
        self.params: Params | None = None
        #: What acts on the models the strategy makes (IMA, robust rules, DP), in order
        #: (:meth:`strategies.base.FedsysStrategy.wrap` attaches them).
        self.wrappers = WrapperChain()
        #: The record last made of :attr:`params` (:meth:`model_record`): a model given
        #: to ``configure_train`` that is this object is the strategy's own.
        self.own_record: ArrayRecord | None = None
        self.poll_interval = 0.1
        self.history: list[dict[str, Any]] = []
        #: Called with the strategy and each round's record (``RoundHook``).
        self.hooks: list[Callable[[Self, dict[str, Any]], None]] = []
        #: The exchange of training messages under way (Flower's ``configure_train``
        #: makes it, ``aggregate_train`` judges its replies: Flower calls them apart).
        self.outgoing = Exchange()
        #: The last exchange's replies, judged (:func:`strategies.replies.judge`).
        self.verdict = Verdict()
        #: Update norms accepted in the last rounds or hops (the yardstick of a round of
        #: fewer than three replies, :func:`strategies.replies.bound`; in the checkpoint).
        self.update_norms: list[float] = []
        self.round_metrics: dict[str, float] = {}
        self.usable_rounds = 0
        #: Training traffic so far; every round's record carries its totals.
        self.traffic = Traffic()
        #: Optional per-round analysis (see ``estimators``): ``(round, updates, new
        #: global model) -> metrics``, set by the runner.
        self.estimator_fn: Callable[[int, list[ClientUpdate], Params], dict[str, float]] | None = None

    # ------------------------------------------------------------------ hooks

    @property
    def label(self) -> str:
        """How the logs name the strategy: the run's label for it where a run gave one
        (``fedavg-trainer-lss``, ``ima``: :attr:`run_label`), else its name with its
        wrappers (``fedavg+ima``)."""
        return self.run_label or self.composition

    @property
    def composition(self) -> str:
        """The method and its wrappers (``fedavg+ima``): what a checkpoint must match."""
        return "+".join([self.name, *(w.name for w in self.wrappers)])

    def tell_once(self, key: str, level: int, msg: str, *args: Any) -> None:
        """Log ``msg`` the first time ``key`` is told in this strategy's life."""
        if key not in self._told:
            self._told.add(key)
            log(level, msg, *args)

    def sample(self, grid: Grid, server_round: int, k: int | None, tag: int = SAMPLE_TAG) -> dict[int, int]:
        """Pick ``k`` nodes (``{node_id: partition_id}``): :meth:`NodeDirectory.sample`
        (``k=None``: Flower's rule, ``fraction_train`` of the connected nodes, at least
        ``min_train_nodes``).  A method with its own draw overrides this."""
        return self.nodes.sample(grid, server_round, k, self.label, self.round_timeout,
                                 self.poll_interval, tag)

    def client_lr(self, server_round: int, lr: float) -> float:
        """Client learning rate of ``server_round`` from the caller's ``lr``:
        ``lr * lr_decay^(round - 1)``, then each wrapper's schedule (IMA's late decay)."""
        current = float(lr * self.lr_decay ** (server_round - 1))
        for w in self.wrappers:
            current = w.client_lr(server_round, lr, self.lr_decay, current)
        return current

    def round_config(self, server_round: int, config: ConfigRecord | Mapping[str, Any]) -> dict[str, Any]:
        """The train settings of one round: the caller's keys, unchanged, plus
        ``server-round`` and ``trainer`` (unless the caller gives one); a caller's
        ``lr`` follows the learning-rate schedule (``lr_decay``, wrappers)."""
        out: dict[str, Any] = dict(config)
        out[proto.SERVER_ROUND] = server_round
        out.setdefault(proto.TRAINER, self.trainer)
        for w in self.wrappers:
            out.update(w.train_config(server_round))
        if proto.LR in out:
            out[proto.LR] = self.client_lr(server_round, float(out[proto.LR]))
        return out

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        """The model sent to one node (the global model; FedCross overrides)."""
        assert self.params is not None
        return self.params

    def payload_models(self, node_id: int, partition_id: int, server_round: int) -> dict[str, Params]:
        """Further named models sent to one node (anchors; none here)."""
        return {}

    def schedule_keys(self) -> list[str]:
        """The options (the method's and its wrappers') whose rounds follow the run's
        length: unset, or given as a fraction of it (FedCDA's warmup, IMA's start)."""
        return [*self.method_schedule_keys(), *(k for w in self.wrappers for k in w.schedule_keys())]

    def method_schedule_keys(self) -> list[str]:
        """The method's own :meth:`schedule_keys` (none here)."""
        return []

    def instruction(self, node_id: int, message_type: str, arrays: Params | ArrayRecord,
                    config: Mapping[str, Any], models: Mapping[str, Params] | None = None
                    ) -> Message:
        """One instruction, its model and settings under the strategy's record names
        (``arrayrecord_key``, ``configrecord_key``)."""
        return proto.message(node_id, message_type, arrays, config, models,
                             self.arrayrecord_key, self.configrecord_key)

    # ------------------------------------------------------------------ Flower API

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes and build one fresh train message per node.

        Called from a round loop of the caller's own (Flower's advanced examples override
        ``start``), which tells the strategy nothing of the run's length: an option that
        follows it (:meth:`schedule_keys`) is then an error naming it, until
        :meth:`prepare` is given the length, as :meth:`start` does.
        """
        if self.num_rounds == 0 and (keys := self.schedule_keys()):
            raise ConfigError(
                f"[{self.label}] the run's length sets {', '.join(keys)}, and start()'s "
                f"num_rounds tells it to the strategy; in a round loop of your own, call "
                f"strategy.prepare(num_rounds) before it (or give them in rounds)")
        self.take_model(server_round, arrays)
        if self.skips_training():  # as Flower's configure_train: nothing to send
            self.outgoing = Exchange()
            return []
        chosen = self.sample(grid, server_round, self.clients_per_round)
        cfg = self.round_config(server_round, config)
        payloads = {n: self.payload_for(n, p, server_round) for n, p in chosen.items()}
        records = exchange_ops.shared_records(payloads.values())
        outbox = [self.instruction(n, MessageType.TRAIN, records[id(payloads[n])], cfg,
                                   self.payload_models(n, p, server_round))
                  for n, p in chosen.items()]
        self.outgoing = Exchange(chosen, payloads, outbox, {
            m.metadata.dst_node_id: m.content.array_records[self.arrayrecord_key] for m in outbox})
        return list(self.outgoing.outbox)

    #: What a model given to ``configure_train`` that is not the strategy's own does (a
    #: round loop of the caller's that changed it between rounds): one line, said in the
    #: log when it happens and in the docs; a strategy whose state is more than one model
    #: says what it does with the rest, and does it in :meth:`adopt`.
    foreign_model: ClassVar[str] = "it becomes the global model the round sends"

    def model_record(self) -> ArrayRecord:
        """:attr:`params` as the record the round loop hands to ``configure_train``
        (remembered: that record is the strategy's own model)."""
        assert self.params is not None
        self.own_record = proto.to_record(self.params)
        return self.own_record

    def take_model(self, server_round: int, arrays: ArrayRecord) -> None:
        """Flower's round semantics: the round sends the ``arrays`` it is given.  The
        strategy's own model (the record it made or returned, or equal values) changes
        nothing; another model is adopted (:meth:`adopt`), said in one INFO line."""
        if arrays is self.own_record and self.params is not None:
            return
        given = proto.from_record(arrays)
        if self.params is None:
            self.params = given
            return
        if given.keys() == self.params.keys() and all(
                np.array_equal(given[k], self.params[k]) for k in given):
            return
        log(INFO, "[%s] round %d: configure_train was given a model other than the "
            "strategy's own: %s", self.label, server_round, self.foreign_model_note())
        self.adopt(given)
        self.own_record = arrays

    def foreign_model_note(self) -> str:
        """The method's :attr:`foreign_model`, then each wrapper's."""
        return "; ".join([self.foreign_model, *(w.foreign_model for w in self.wrappers
                                                 if w.foreign_model)])

    def adopt(self, params: Params) -> None:
        """Take ``params``, a model given to ``configure_train`` that is not the
        strategy's own, as :attr:`foreign_model` says."""
        self.params = params

    def skips_training(self) -> bool:
        """Whether a round sends no train message: ``fraction_train=0.0`` without a fixed
        ``clients_per_round`` (Flower's strategies skip federated training so)."""
        return self.nodes.fraction_train == 0.0 and self.clients_per_round is None

    def validate(self, replies: Iterable[Message], exchange: Exchange | None = None) -> Verdict:
        """The replies to ``exchange`` (default :attr:`outgoing`) through the reply
        pipeline (:func:`strategies.replies.judge`, the wrappers' screen its last step),
        logged; what the run learnt is kept (a node's first partition-id, the update
        norms).  The verdict is also :attr:`verdict`."""
        ex = self.outgoing if exchange is None else exchange
        verdict = pipeline.judge(replies, RoundView.of(ex, self.nodes.known, self.update_norms),
                                 self.replies, self.wrappers.screen)
        pipeline.tell(verdict, self.replies, self.label)
        for node, pid in verdict.reported.items():
            self.nodes.known.partition_ids.setdefault(node, pid)
        self.update_norms = [*self.update_norms, *verdict.norms][-pipeline.EARLIER:]
        self.verdict = verdict
        return verdict

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        """Return the new global model from validated updates (subclasses)."""
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, aggregate the good ones, report train metrics.

        The training loss (``train_loss_key``) is the example-weighted mean over the
        updates that report one; the clients' other metrics as Flower's strategies
        report them (:meth:`client_metrics`).  A round without a usable update is an
        ERROR saying why (the refusals' reasons).
        """
        replies = list(replies)
        if self.params is None:
            raise AggregationError(
                f"[{self.label}] aggregate_train for round {server_round} before any "
                "configure_train: the strategy has no model, and no record of what it sent "
                "to check the replies against; call configure_train first (as Flower's "
                "Strategy.start does)")
        verdict = self.validate(replies)
        updates, rejected = verdict.updates, verdict.refused
        self.round_metrics = {}
        new = self.aggregate(server_round, updates) if updates else None
        if new is None:
            if not (self.skips_training() and not replies):
                log(ERROR, "[%s] round %d: no usable update (%d replies refused or missing: "
                    "%s); model unchanged", self.label, server_round, len(rejected),
                    why_refused(rejected))
        else:
            if self.params is not None:  # how far the broadcast model moved this round
                self.round_metrics["global-step"] = distance(new, self.params)
            self.params = new
            self.round_metrics.update(self.wrappers.metrics())
            if self.estimator_fn is not None:
                self.round_metrics.update(self.estimator_fn(server_round, updates, new))
        metrics = client_metrics.train_metrics(updates, len(rejected), self.train_loss_key)
        self.add_client_metrics(metrics, verdict, own=self.round_metrics)
        metrics.update(self.round_metrics)
        return (self.model_record() if new is not None else None), proto.metric_record(metrics)

    def add_client_metrics(self, record: dict[str, Any], verdict: Verdict,
                           own: Iterable[str] = ()) -> None:
        """Put the round's client metrics into ``record``
        (:func:`strategies.client_metrics.client_metrics`: the caller's
        ``train_metrics_aggr_fn`` on the used replies' contents, else Flower's default),
        but where one shares a name with the record's own bookkeeping or with ``own``
        (said once).  The clients' training loss and work, which the round reports from
        the replies, are the caller's ``train_metrics_aggr_fn``'s where it gives them (as
        on Flower's strategies, whose train metrics are what that function returns)."""
        theirs, dropped = client_metrics.client_metrics(
            verdict, self.train_metrics_aggr_fn, self.weighted_by_key,
            (self.weighted_by_key, self.train_loss_key, proto.TRAINED_EXAMPLES))
        if dropped:
            self.tell_once("metric-lists", WARNING, "[%s] train_metrics_aggr_fn returned "
                           "non-scalar metric(s) %s: left out of the round's record",
                           self.label, dropped)
        taken = (set(record) | set(own)) - {self.train_loss_key, proto.TRAINED_EXAMPLES}
        clash = sorted(k for k in theirs if k in taken)
        if clash:
            self.tell_once("metric-clash", WARNING, "[%s] client metric(s) %s share a name with "
                           "the round's own; the round's are reported", self.label, clash)
        record.update({k: v for k, v in theirs.items() if k not in taken})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on ``fraction_evaluate`` of the nodes (0: none)."""
        if self.fraction_evaluate <= 0:
            return []
        connected = len(list(grid.get_node_ids()))
        n = min(connected, max(self.min_evaluate_nodes, math.ceil(self.fraction_evaluate * connected)))
        chosen = self.sample(grid, server_round, n, tag=EVAL_TAG)
        cfg = {**dict(config), proto.SERVER_ROUND: server_round}
        return [self.instruction(nd, MessageType.EVALUATE, arrays, cfg) for nd in chosen]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The caller's ``evaluate_metrics_aggr_fn`` on the replies' contents (error
        replies left out), else the mean of the clients' evaluation metrics weighted by
        ``weighted_by_key`` (:func:`strategies.client_metrics.evaluate_mean`).  Error replies are
        a WARNING with their count and reason, and replies that give no mean (none holds
        the weight) one, so that a round without federated metrics says why."""
        replies = list(replies)
        errors = [r for r in replies if r.has_error()]
        if errors:
            log(WARNING, "[%s] round %d: %d of %d evaluate replies are errors (%s)", self.label,
                server_round, len(errors), len(replies), str(errors[0].error.reason)[-200:])
        good = [r.content for r in replies if not r.has_error() and r.has_content()]
        if self.evaluate_metrics_aggr_fn is not None:
            return self.evaluate_metrics_aggr_fn(good, self.weighted_by_key) if good else None
        mean = client_metrics.evaluate_mean(replies, self.weighted_by_key)
        if mean is None and good:
            self.tell_once("eval-weight", WARNING, "[%s] evaluate replies hold no finite '%s' "
                           "(weighted_by_key) to weigh their metrics by: no federated "
                           "evaluation metrics", self.label, self.weighted_by_key)
        return None if mean is None else proto.metric_record(mean)

    # ------------------------------------------------------------------ loop

    def run_round(self, grid: Grid, server_round: int, train_config: ConfigRecord) -> dict[str, Any]:
        """One training round: configure, send, wait (with timeout), aggregate.

        A strategy with another loop (e.g. a chain of single-node hops) overrides
        this method and returns its round metrics.
        """
        assert self.params is not None
        sent = list(self.configure_train(server_round, self.model_record(), train_config, grid))
        ex = exchange_ops.as_returned(self.outgoing, sent, self.arrayrecord_key,
                                      self.nodes.known.partition_ids)
        replies = exchange_ops.resend_lost(  # a reply lost on the way: asked again
            grid, ex, self.exchange(grid, ex), self.traffic, retries=self.transport_retries,
            timeout=self.round_timeout, poll_interval=self.poll_interval, label=self.label,
            server_round=server_round)
        _, metrics = self.aggregate_train(server_round, replies)
        return {k: float(v) for k, v in (metrics or {}).items()}  # type: ignore[arg-type]

    def exchange(self, grid: Grid, ex: Exchange) -> list[Message]:
        """Send ``ex``'s instructions, wait for the replies (``round_timeout``), count the
        traffic; the replies.  ``ex`` becomes :attr:`outgoing`."""
        self.outgoing = ex
        return exchange_ops.send(grid, ex, self.traffic, self.round_timeout, self.poll_interval)

    def train_hop(
        self, grid: Grid, server_round: int, node_id: int, partition_id: int, params: Params,
        train_config: ConfigRecord | Mapping[str, Any] | None = None,
        models: Mapping[str, Params] | None = None,
    ) -> Verdict:
        """Send ``params`` to one node, wait for its reply, judge it.

        The building block of sequential strategies (a chain of single-node hops,
        FedSeq / FedELMY): the verdict holds the one update, or why the hop failed
        (logged).
        """
        cfg = self.round_config(server_round, train_config or {})
        ex = Exchange({node_id: partition_id}, {node_id: params},
                      [self.instruction(node_id, MessageType.TRAIN, params, cfg, models)])
        return self.validate(self.exchange(grid, ex), ex)

    def discover(self, grid: Grid) -> None:
        """Learn what the plan needs from the connected nodes before the first round
        (nothing here; a chain learns the partitions it visits)."""

    def evaluate_now(self, rnd: int) -> bool:
        """Whether round ``rnd`` ends with an evaluation (every round here)."""
        return True

    def progress(self, record: dict[str, Any]) -> str:
        """Where the run stands after ``record``, for the progress line."""
        return f"round {int(record['round'])}/{self.num_rounds}"
