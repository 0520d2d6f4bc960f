"""Flower's message API over a fedsys strategy's parts: ``configure_train``,
``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate`` and ``start``
(:class:`RoundEngine`), one training round with its resends (:meth:`RoundEngine.run_round`)
and a chain's hop (:meth:`RoundEngine.train_hop`).

It works on the parts the strategy's constructor hands in (the settings, the nodes, the
reply pipeline's policy) and its own (the global model under Flower's round semantics,
:mod:`strategies.model`; the exchange of messages, :mod:`strategies.exchange`; the
wrappers), and asks the method through the hooks of :class:`strategies.hooks.MethodHooks`.
A round's products travel as values: the method's :class:`~strategies.model.Aggregate`,
the replies' :class:`~strategies.replies.Verdict`, the round's record; the loop of rounds
is :class:`strategies.loop.RoundLoop`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from logging import ERROR, INFO, WARNING
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.exception import AggregationError
from flwr.serverapp.strategy import Result
from flwr.supercore import log

import strategies.client_metrics as client_metrics
import strategies.exchange as exchange_ops
import strategies.replies as pipeline
from fedsys import protocol as proto
from fedsys.options import ConfigError
from fedsys.params import Params, distance
from fedsys.validation import ClientUpdate, Rejection
from strategies.exchange import Exchange
from strategies.hooks import MethodHooks
from strategies.loop import EstimatorFn, EvaluateFn, RoundHook, RoundLoop
from strategies.model import Aggregate
from strategies.nodes import EVAL_TAG
from strategies.replies import RoundView, Verdict, why_refused

if TYPE_CHECKING:
    from strategies.client_metrics import MetricsAggrFn


class RoundEngine(MethodHooks):
    """Flower's :class:`Strategy` API and a round, over a method's hooks and a
    strategy's parts (see the module docstring)."""

    # ------------------------------------------------------------------ Flower's attributes
    # Flower's FedAvg keeps its keywords as attributes, which a caller may reassign; here
    # they are read-only, the values of :attr:`settings`: the node directory and the reply
    # pipeline are built from them and would not see a new value.

    @property
    def fraction_train(self) -> float:
        """Flower's attribute: the fraction of the connected nodes sampled for training."""
        return self.settings.fraction_train

    @property
    def fraction_evaluate(self) -> float:
        """Flower's attribute: the fraction of the nodes asked to evaluate."""
        return self.settings.fraction_evaluate

    @property
    def min_train_nodes(self) -> int:
        """Flower's attribute: the fewest nodes sampled for training."""
        return self.settings.min_train_nodes

    @property
    def min_evaluate_nodes(self) -> int:
        """Flower's attribute: the fewest nodes sampled for evaluation."""
        return self.settings.min_evaluate_nodes

    @property
    def min_available_nodes(self) -> int:
        """Flower's attribute: the fewest connected nodes a round starts with."""
        return self.settings.min_available_nodes

    @property
    def weighted_by_key(self) -> str:
        """Flower's attribute: the reply metric an update is weighted by."""
        return self.settings.weighted_by_key

    @property
    def arrayrecord_key(self) -> str:
        """Flower's attribute: the name an instruction's model travels under."""
        return self.settings.arrayrecord_key

    @property
    def configrecord_key(self) -> str:
        """Flower's attribute: the name an instruction's settings travel under."""
        return self.settings.configrecord_key

    @property
    def train_metrics_aggr_fn(self) -> MetricsAggrFn | None:
        """Flower's attribute: the caller's rule for the round's client train metrics
        (None: Flower's default)."""
        return self.settings.train_metrics_aggr_fn

    @property
    def evaluate_metrics_aggr_fn(self) -> MetricsAggrFn | None:
        """Flower's attribute: the caller's rule for the round's client evaluation
        metrics (None: Flower's default)."""
        return self.settings.evaluate_metrics_aggr_fn

    def instruction(self, node_id: int, message_type: str, arrays: Params | ArrayRecord,
                    config: Mapping[str, Any], models: Mapping[str, Params] | None = None
                    ) -> Message:
        """One instruction, its model and settings under the strategy's record names
        (``arrayrecord_key``, ``configrecord_key``)."""
        return proto.message(node_id, message_type, arrays, config, models,
                             self.settings.arrayrecord_key, self.settings.configrecord_key)

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
        if self.settings.skips_training:  # as Flower's configure_train: nothing to send
            self.outgoing = Exchange()
            return []
        chosen = self.sample(grid, server_round, self.settings.clients_per_round)
        cfg = proto.config_record(self.round_config(server_round, config))  # copied per node
        payloads = {n: self.payload_for(n, p, server_round) for n, p in chosen.items()}
        records = exchange_ops.shared_records(payloads.values())
        outbox = [self.instruction(n, MessageType.TRAIN, records[id(payloads[n])], cfg,
                                   self.payload_models(n, p, server_round))
                  for n, p in chosen.items()]
        self.outgoing = Exchange(chosen, payloads, outbox, {
            m.metadata.dst_node_id: proto.array_records(m.content)[self.settings.arrayrecord_key]
            for m in outbox})
        return list(self.outgoing.outbox)

    def model_record(self) -> ArrayRecord:
        """:attr:`params` as the record the round loop hands to ``configure_train``
        (:meth:`GlobalModel.record`)."""
        return self.model.record()

    def take_model(self, server_round: int, arrays: ArrayRecord) -> None:
        """Flower's round semantics: the round sends the ``arrays`` it is given.  The
        strategy's own model changes nothing; another is adopted (:meth:`adopt`), said in
        one INFO line (:meth:`GlobalModel.foreign`)."""
        given = self.model.foreign(arrays)
        if given is not None:
            log(INFO, "[%s] round %d: configure_train was given a model other than the "
                "strategy's own: %s", self.label, server_round, self.foreign_model_note())
            self.adopt(given)
            self.model.own = arrays

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
        result = self.aggregated(server_round, updates)
        own, new = dict(result.metrics), result.model
        if new is None:
            if not (self.settings.skips_training and not replies):
                self.log_unusable(server_round, rejected)
        else:  # how far the broadcast model moved this round
            own["global-step"] = distance(new, self.params)
            self.params = new
            own.update(self.wrappers.metrics())
        metrics = client_metrics.train_metrics(updates, len(rejected), self.settings.train_loss_key)
        self.add_client_metrics(metrics, verdict, own=own)
        metrics.update(own)
        return (self.model_record() if new is not None else None), proto.metric_record(metrics)

    def aggregated(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """The method's :meth:`aggregate` of ``updates`` (none: no model), then its
        wrappers' (:meth:`strategies.wrapper.WrapperChain.release`): what a round or a hop
        makes.  A method that declares a mean (``traits.mean``) and made a model without
        taking it while a wrapper replaces it is an error (the rule would not have acted)."""
        if not updates:
            return Aggregate(None)
        self.wrappers.averaged = 0
        result: Any = self.aggregate(server_round, updates)
        if not isinstance(result, Aggregate):  # a model, as aggregate returned before Aggregate
            self.tell_once("bare-model", WARNING, "[%s] aggregate returned %s, not "
                           "strategies.base.Aggregate(model, metrics): taken as the round's "
                           "model", self.label, type(result).__name__)
            result = Aggregate(*result) if isinstance(result, tuple) else Aggregate(result)
        result = self.wrappers.release(server_round, result)
        if (result.model is not None and self.wrappers.replaces_mean
                and self.traits.mean != "none" and not self.wrappers.averaged):
            raise RuntimeError(
                f"[{self.label}] round {server_round}: {type(self).__name__} declares a mean of "
                f"the round's models (traits.mean={self.traits.mean!r}) but made its model "
                f"without self.average(...), so {', '.join(w.name for w in self.wrappers if w.replaces_mean)} "
                f"did not act: take the mean through self.average, or declare "
                f"traits = Traits(mean='none')")
        return result

    def log_unusable(self, server_round: int, rejected: Sequence[Rejection]) -> None:
        """The ERROR of a round (a parallel step) that made no model: how many replies were
        refused or missing, and why (:func:`strategies.replies.why_refused`)."""
        log(ERROR, "[%s] round %d: no usable update (%d replies refused or missing: %s); "
            "model unchanged", self.label, server_round, len(rejected), why_refused(rejected))

    def add_client_metrics(self, record: dict[str, Any], verdict: Verdict,
                           own: Iterable[str] = ()) -> None:
        """Put the round's client metrics into ``record``
        (:func:`strategies.client_metrics.add_client_metrics`, the caller's
        ``train_metrics_aggr_fn`` or Flower's default); what is left out, said once."""
        s = self.settings
        dropped, clash = client_metrics.add_client_metrics(
            record, verdict, s.train_metrics_aggr_fn, s.weighted_by_key, s.train_loss_key, own)
        if dropped:
            self.tell_once("metric-lists", WARNING, "[%s] train_metrics_aggr_fn returned "
                           "non-scalar metric(s) %s: left out of the round's record",
                           self.label, dropped)
        if clash:
            self.tell_once("metric-clash", WARNING, "[%s] client metric(s) %s share a name with "
                           "the round's own; the round's are reported", self.label, clash)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on ``fraction_evaluate`` of the nodes (0: none)."""
        s = self.settings
        if s.fraction_evaluate <= 0:
            return []
        connected = len(list(grid.get_node_ids()))
        n = min(connected, max(s.min_evaluate_nodes, math.ceil(s.fraction_evaluate * connected)))
        chosen = self.sample(grid, server_round, n, tag=EVAL_TAG)
        cfg = proto.config_record({**dict(config), proto.SERVER_ROUND: server_round})
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
        key = self.settings.weighted_by_key
        record, unweighed = client_metrics.evaluate_metrics(
            replies, self.settings.evaluate_metrics_aggr_fn, key)
        if unweighed:
            self.tell_once("eval-weight", WARNING, "[%s] evaluate replies hold no finite '%s' "
                           "(weighted_by_key) to weigh their metrics by: no federated "
                           "evaluation metrics", self.label, key)
        return record

    # ------------------------------------------------------------------ a round, a hop

    def run_round(self, grid: Grid, server_round: int, train_config: ConfigRecord) -> dict[str, Any]:
        """One training round: configure, send, wait (with timeout), aggregate.

        A strategy with another loop (e.g. a chain of single-node hops) overrides
        this method and returns its round metrics.
        """
        assert self.params is not None
        sent = list(self.configure_train(server_round, self.model_record(), train_config, grid))
        ex = exchange_ops.as_returned(self.outgoing, sent, self.settings.arrayrecord_key,
                                      self.nodes.known.partition_ids)
        replies = exchange_ops.resend_lost(  # a reply lost on the way: asked again
            grid, ex, self.exchange(grid, ex), self.traffic, retries=self.settings.transport_retries,
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
        return self.train_nodes(grid, {node_id: partition_id}, params, {node_id: cfg}, models)

    def train_nodes(
        self, grid: Grid, nodes: Mapping[int, int], params: Params,
        configs: Mapping[int, Mapping[str, Any]], models: Mapping[str, Params] | None = None,
    ) -> Verdict:
        """Send ``params`` to every node of ``nodes`` (``{node_id: partition_id}``) with its
        settings (``configs[node_id]``, a :meth:`round_config`), wait for the replies
        (``round_timeout``), judge them (:meth:`validate`, logged): a chain's hop
        (:meth:`train_hop`) and a plan's parallel step, outside Flower's configure/aggregate
        pair, which samples."""
        ex = Exchange(dict(nodes), dict.fromkeys(nodes, params),
                      [self.instruction(n, MessageType.TRAIN, params, configs[n], models)
                       for n in nodes])
        return self.validate(self.exchange(grid, ex), ex)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        *,
        on_round: Sequence[RoundHook] = (),
        estimator_fn: EstimatorFn | None = None,
        label: str = "",
    ) -> Result:
        """Run rounds ``self.round + 1 .. num_rounds`` (resumes after a checkpoint): the
        round loop, :class:`strategies.loop.RoundLoop`.

        As Flower's :meth:`Strategy.start`: ``num_rounds`` sets the schedule (and what
        depends on it: IMA's start round, a warmup given as a fraction), ``timeout``
        bounds each round's wait for replies, ``train_config`` and ``evaluate_config``
        reach the clients with their keys unchanged (see :meth:`round_config`), and
        ``evaluate_fn(round, arrays)`` evaluates the global model centrally, also
        before round 1.  fedsys's keywords, none needed from a Flower app (each
        documented at :class:`~strategies.loop.RoundLoop`): ``on_round``, callbacks
        given each round's record; ``estimator_fn``, a round's analysis for its record;
        ``label``, how this run's log lines name the strategy.
        """
        return RoundLoop(self, grid, timeout, train_config, evaluate_config, evaluate_fn,
                         on_round=on_round, estimator_fn=estimator_fn,
                         label=label).run(initial_arrays, num_rounds)
