"""The fedsys server base class, on Flower's message-API :class:`Strategy`.

Build a fedsys strategy like one of Flower's own::

    strategy = FedCDAStrategy(fraction_train=0.25, min_available_nodes=4, memory=3)
    result = strategy.start(grid, initial_arrays, num_rounds=50, timeout=600,
                            train_config=ConfigRecord({"lr": 0.01}), evaluate_fn=...)

Keyword arguments are Flower's usual ones, a few of fedsys's and the method's own
options, declared once in its module as a frozen dataclass (:attr:`FedsysStrategy.Options`)
whose fields are also its config keys (``fedcda.memory``); :meth:`FedsysStrategy.from_config`
builds the same object from a fedsys run config.  The base keeps Flower's template
:meth:`~FedsysStrategy.start` (``num_rounds`` sets the schedule, ``timeout`` bounds each
round, the caller's ``train_config`` keys reach the clients unchanged), the hooks a method
overrides (:meth:`~FedsysStrategy.aggregate`; :meth:`~FedsysStrategy.payload_for` for a
model per node; :meth:`~FedsysStrategy.run_round` for another loop, a chain's hops), the
options and the state (:meth:`~FedsysStrategy.state_dict`).  The rest is in modules of its
own: who the nodes are and which a round samples (:mod:`strategies.nodes`: partition-ids
a node reports, one QUERY per node only with ``query_partitions=True``), one exchange of
messages with its resends and traffic (:mod:`strategies.exchange`), which replies are usable
(:mod:`strategies.replies`: error replies, missing keys, shape or dtype mismatch, NaN or
Inf, a metric the method needs; each refusal logged, the round goes on) and what acts on
every strategy's models (:mod:`strategies.wrapper`: IMA).  Pure maths lives in
:mod:`fedsys`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import ERROR, INFO
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

import strategies.exchange as exchange_ops
import strategies.replies as replies_ops
from fedsys import protocol as proto
from fedsys import transport
from fedsys.options import ConfigError, parse_group, suggest
from fedsys.params import Params, copy, distance
from fedsys.validation import ClientUpdate, Rejection
from strategies.exchange import TRAFFIC_KEYS, Exchange, Traffic
from strategies.nodes import EVAL_TAG, SAMPLE_TAG, NodeDirectory, NodesUnavailableError
from strategies.replies import ReplyPolicy, why_refused
from strategies.wrapper import StrategyWrapper

if TYPE_CHECKING:
    from fedsys.config import RunConfig

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
RoundHook = Callable[["FedsysStrategy", dict[str, Any]], None]
#: Builds a registered strategy by name from a run config (for composites like IMA).
Builder = Callable[[str], "FedsysStrategy"]



class NoUsableUpdateError(RuntimeError):
    """No round of a run produced a usable update (every reply was refused or missing)."""


@dataclass(frozen=True)
class NoOptions:
    """A method without options of its own."""


class FedsysStrategy(Strategy):
    """Base class of every fedsys strategy (see the module docstring).

    Parameters
    ----------
    fraction_train : float, default 1.0
        Fraction of the connected nodes sampled for training each round, at least
        ``min_train_nodes`` (Flower's rule); ignored when ``clients_per_round`` is set.
    fraction_evaluate : float, default 1.0
        Fraction of the nodes asked for federated evaluation (0: none).
    min_train_nodes, min_evaluate_nodes : int, default 2
        Fewest nodes sampled for training / evaluation.
    min_available_nodes : int, default 2
        Fewest connected nodes a round may start with.  A round waits up to
        ``node_wait_timeout`` seconds for the nodes it wants, then goes on if at least
        this many are connected, else raises :class:`NodesUnavailableError` (it never
        waits forever, unlike Flower's sampler).
    clients_per_round : int, optional
        Sample exactly this many nodes per round (fedsys's ``clients-per-round``).
    seed : int, default 0
        Seeds node sampling (and any draw of the method).
    node_wait_timeout : float, default 120.0
        Seconds to wait for enough nodes.
    lr_decay : float, default 1.0
        Per-round decay of the caller's ``lr`` key: ``lr * lr_decay**(round - 1)``.
    trainer : str, default "auto"
        The fedsys client trainer named in each train instruction (``trainer`` key,
        unless the caller's ``train_config`` names one); ``auto`` takes the method's.
    num_partitions : int, optional
        The partitions the nodes should hold; a node declaring another count is
        logged (the federation and the config disagree).
    max_examples_ratio : float, default 100.0
        A reply claiming more ``num-examples`` than its node declared for its partition
        is refused (logged with the numbers), so no reply takes over an aggregate by what
        it claims; a node that declared none may claim up to this many times the median
        of the round's other claims (0: no such bound).
    transport_retries : int, default 1
        Times a round sends its instruction again to a node whose reply was lost on
        the way (an error reply with Flower's code 3, 4 or 5), within the round.
    query_partitions : bool, default False
        Before sampling, send every node not seen before one QUERY message asking for
        its ``partition-id`` and its partition's size (the most ``num-examples`` its
        replies may then claim); a node that does not answer is keyed by its node id.
        Off (Flower's way): only train and evaluate messages are sent, and a node's
        partition is the ``partition-id`` its first train reply reports, if any.
        Sampling by partition-id from round 1, the same for a seed whatever node ids
        Flower assigned, needs it on; fedsys's own ServerApp turns it on (its ClientApp
        answers queries, :mod:`launch.client_app`).
    train_loss_key : str, default "train_loss"
        The train-reply metric holding the client's training loss (the name Flower's
        app template reports and Flower's ``QFedAvg`` reads; fedsys's own ClientApp
        reports ``train-loss``); the round's example-weighted mean is reported under
        the same name.
    weighted_by_key : str, default "num-examples"
        The train-reply metric holding the number of examples an update is weighted by
        (Flower's ``weighted_by_key``); a reply without it is refused.
    **options
        The method's own options (the fields of :attr:`Options`).
    """

    name: ClassVar[str] = "base"
    default_trainer: ClassVar[str] = "sgd"
    #: The method's options (a frozen dataclass of :func:`fedsys.options.option` fields).
    Options: ClassVar[type] = NoOptions
    #: Config-key prefix of :attr:`Options` (empty: the strategy's ``name``).
    option_prefix: ClassVar[str] = ""
    #: Reply metrics the method cannot work without (besides ``weighted_by_key``): the
    #: keyword naming each (``"train_loss_key"``) and why the method needs it.
    required_metrics: ClassVar[dict[str, str]] = {}
    #: Write a checkpoint after every round whatever ``checkpoint-every`` says (a chain's hops).
    checkpoint_each_round: ClassVar[bool] = False

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        clients_per_round: int | None = None,
        seed: int = 0,
        node_wait_timeout: float = 120.0,
        lr_decay: float = 1.0,
        trainer: str = "auto",
        num_partitions: int | None = None,
        max_examples_ratio: float = 100.0,
        transport_retries: int = 1,
        query_partitions: bool = False,
        train_loss_key: str = proto.FLOWER_TRAIN_LOSS,
        weighted_by_key: str = proto.NUM_EXAMPLES,
        **options: Any,
    ) -> None:
        self.options = self.parse_options(options)
        self.fraction_train = float(fraction_train)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_train_nodes = int(min_train_nodes)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.min_available_nodes = int(min_available_nodes)
        self.clients_per_round = clients_per_round
        self.seed = int(seed)
        self.node_wait_timeout = float(node_wait_timeout)
        self.lr_decay = float(lr_decay)
        self.trainer = self.default_trainer if trainer == "auto" else trainer
        self.num_partitions = num_partitions
        self.num_rounds = 0
        self.round_timeout = 3600.0
        self.round = 0
        self.params: Params | None = None
        self.query_partitions = bool(query_partitions)
        self.train_loss_key = str(train_loss_key)
        self.weighted_by_key = str(weighted_by_key)
        #: Who the nodes are and which a round samples (:mod:`strategies.nodes`).
        self.nodes = NodeDirectory(
            seed=self.seed, fraction_train=self.fraction_train,
            min_train_nodes=self.min_train_nodes, min_available_nodes=self.min_available_nodes,
            wait_timeout=self.node_wait_timeout, query=self.query_partitions,
            num_partitions=num_partitions, tell=self.tell_once)
        self.max_examples_ratio = float(max_examples_ratio)
        #: Which train replies the method uses (:mod:`strategies.replies`).
        self.replies = ReplyPolicy(
            self.name, self.weighted_by_key, self.train_loss_key, self.max_examples_ratio,
            {str(getattr(self, kw)): (kw, why) for kw, why in self.required_metrics.items()},
            self.tell_once)
        self.transport_retries = int(transport_retries)
        self.history: list[dict[str, Any]] = []
        self.hooks: list[RoundHook] = []
        self.wrappers: list[StrategyWrapper] = []
        self.last_rejections: list[Rejection] = []
        self.poll_interval = 0.1
        #: The last exchange of training messages (:meth:`exchange`; Flower's
        #: ``configure_train`` makes it, ``aggregate_train`` reads it).
        self.last_exchange = Exchange()
        self._told: set[str] = set()
        self.workdir: Path | None = None
        #: The name a run gives this strategy (its results directory), used in the logs.
        self.run_label = ""
        self.round_metrics: dict[str, float] = {}
        self.last_updates: list[ClientUpdate] = []
        self.last_replies: list[Message] = []
        self.usable_rounds = 0
        #: Training traffic so far; every round's record carries its totals.
        self.traffic = Traffic()
        #: Optional per-round analysis (see ``estimators``): ``(round, updates, new
        #: global model) -> metrics``, set by the runner.
        self.estimator_fn: Callable[[int, list[ClientUpdate], Params], dict[str, float]] | None = None

    # ------------------------------------------------------------------ options

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the method's options."""
        return cls.option_prefix or cls.name

    @classmethod
    def parse_options(cls, values: Mapping[str, Any]) -> Any:
        """Build :attr:`Options` from keyword arguments; a wrong name is a TypeError."""
        names = [f.name for f in dataclasses.fields(cls.Options)]
        common = [p for p in inspect.signature(FedsysStrategy.__init__).parameters
                  if p not in ("self", "options")]
        for k in values:
            if k not in names:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                                f"{k!r}.{suggest(k, names + common).split(' Run')[0]}")
        return parse_group(cls.Options, cls.prefix(), values)

    @classmethod
    def config_kwargs(cls, cfg: RunConfig) -> dict[str, Any]:
        """Keyword arguments of the strategy from a fedsys run config."""
        fields = {f.name for f in dataclasses.fields(cls.Options)}
        opts = {f: v for f, v in cfg.fields_of(cls.prefix()).items() if f in fields}
        return {
            "clients_per_round": cfg.clients_per_round,
            "min_available_nodes": cfg.min_available_clients,
            "fraction_evaluate": cfg.fraction_evaluate,
            "min_evaluate_nodes": 1,
            "seed": cfg.seed,
            "node_wait_timeout": cfg.node_wait_timeout,
            "lr_decay": cfg.lr_decay,
            "trainer": cfg.trainer,
            "num_partitions": cfg.num_clients,
            "max_examples_ratio": cfg.max_examples_ratio,
            "transport_retries": cfg.transport_retries,
            # fedsys's own ClientApp answers the query and reports fedsys's metric names
            "query_partitions": cfg.query_partitions,
            "train_loss_key": proto.TRAIN_LOSS,
            "weighted_by_key": proto.NUM_EXAMPLES,
            **opts,
        }

    @classmethod
    def from_config(cls, cfg: RunConfig, build: Builder | None = None) -> Self:
        """The strategy a fedsys run config describes (``build`` makes other
        registered strategies by name, for composites)."""
        return cls(**cls.config_kwargs(cfg))

    def wrap(self, wrapper: StrategyWrapper) -> FedsysStrategy:
        """Attach a :class:`StrategyWrapper`; returns ``self``."""
        self.wrappers.append(wrapper)
        return self

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

    def finish(self, server_round: int, models: dict[int, Params]) -> dict[int, Params]:
        """Pass the models the strategy has just made through every wrapper.

        ``models`` maps a slot (0 for a single global model) to a model; each wrapper
        may return another model for a slot (see :class:`StrategyWrapper`).
        """
        for w in self.wrappers:
            models = {i: w.transform(server_round, i, m) for i, m in sorted(models.items())}
        return models

    # ------------------------------------------------------------------ nodes

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

    # ------------------------------------------------------------------ config

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
        if proto.LR in out:
            out[proto.LR] = self.client_lr(server_round, float(out[proto.LR]))
        return out

    # ------------------------------------------------------------------ Flower API

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        """The model sent to one node (the global model; FedCross overrides)."""
        assert self.params is not None
        return self.params

    def payload_models(self, node_id: int, partition_id: int, server_round: int) -> dict[str, Params]:
        """Further named models sent to one node (anchors; none here)."""
        return {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes and build one fresh train message per node."""
        if self.params is None:
            self.params = proto.from_record(arrays)
        chosen = self.sample(grid, server_round, self.clients_per_round)
        cfg = self.round_config(server_round, config)
        payloads = {n: self.payload_for(n, p, server_round) for n, p in chosen.items()}
        self.last_exchange = Exchange(chosen, payloads, [
            proto.message(n, MessageType.TRAIN, payloads[n], cfg,
                          self.payload_models(n, p, server_round))
            for n, p in chosen.items()
        ])
        return list(self.last_exchange.outbox)

    def validate(self, replies: Iterable[Message], exchange: Exchange | None = None
                 ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Split the replies to ``exchange`` (default :attr:`last_exchange`) into usable
        updates and logged rejections (:meth:`strategies.replies.ReplyPolicy.sort`)."""
        ok, bad = self.replies.sort(replies, self.last_exchange if exchange is None else exchange,
                                    self.nodes.known, self.label)
        self.last_rejections = bad
        return ok, bad

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        """Return the new global model from validated updates (subclasses)."""
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, aggregate the good ones, report train metrics.

        The training loss (``train_loss_key``) is the example-weighted mean over the
        updates that report one.  A round without a usable update is an ERROR saying
        why (the refusals' reasons).
        """
        updates, rejected = self.validate(replies)
        self.round_metrics = {}
        new = self.aggregate(server_round, updates) if updates else None
        if new is None:
            log(ERROR, "[%s] round %d: no usable update (%d replies refused or missing: %s); "
                "model unchanged", self.label, server_round, len(rejected),
                why_refused(rejected))
        else:
            if self.params is not None:  # how far the broadcast model moved this round
                self.round_metrics["global-step"] = distance(new, self.params)
            self.params = new
            for w in self.wrappers:
                self.round_metrics.update(w.round_metrics())
            if self.estimator_fn is not None:
                self.round_metrics.update(self.estimator_fn(server_round, updates, new))
        self.last_updates = updates
        metrics = replies_ops.train_metrics(updates, len(rejected), self.train_loss_key)
        metrics.update(self.round_metrics)
        return (proto.to_record(new) if new is not None else None), proto.metric_record(metrics)

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
        return [proto.message(nd, MessageType.EVALUATE, arrays, cfg) for nd in chosen]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Mean of the clients' evaluation metrics weighted by ``weighted_by_key``
        (:func:`strategies.replies.evaluate_mean`)."""
        mean = replies_ops.evaluate_mean(replies, self.weighted_by_key)
        return None if mean is None else proto.metric_record(mean)

    def summary(self) -> None:
        """Log the strategy's settings."""
        per_round = (f"{self.clients_per_round}" if self.clients_per_round is not None
                     else f"fraction {self.fraction_train:g} (>= {self.min_train_nodes})")
        log(INFO, "[%s] %d rounds, %s clients per round, trainer=%s, seed=%d, options %s",
            self.label, self.num_rounds, per_round, self.trainer, self.seed, self.options)
        for w in self.wrappers:
            w.summary()

    # ------------------------------------------------------------------ loop

    def prepare(self, num_rounds: int) -> None:
        """Fix the schedule's length (what depends on it: a warmup given as a fraction,
        a wrapper's start round).  :meth:`start` calls it with its ``num_rounds``."""
        self.num_rounds = int(num_rounds)
        self.on_start(self.num_rounds)
        for w in self.wrappers:
            w.on_start(self, self.num_rounds)
        inert = [*self.inert_options(self.num_rounds),
                 *(p for w in self.wrappers for p in w.inert_options(self, self.num_rounds))]
        if inert:
            raise ConfigError(f"[{self.label}] " + "; ".join(inert))

    def on_start(self, num_rounds: int) -> None:
        """Called by :meth:`prepare` once the schedule's length is known (strategies
        whose options depend on it, e.g. a warmup given as a fraction, resolve here)."""

    def inert_options(self, num_rounds: int) -> list[str]:
        """What in the options would leave the method inert for ``num_rounds`` rounds
        (a warmup that covers the run, a mixing weight that mixes nothing: one sentence
        each, naming the key and the value); :meth:`prepare` (so :meth:`start` and
        ``fedsys run`` before any engine starts) refuses the run when there is any."""
        return []

    def branch_late_keys(self, rnd: int) -> frozenset[str]:
        """Config keys that have not acted by the end of round ``rnd``: a run branched
        from a checkpoint of that round may set them otherwise than its parent did
        (``branch-from``, :func:`launch.lifecycle.branch_point`).  The strategy's own
        (none by default) and its wrappers'."""
        return frozenset().union(*(w.branch_late_keys(self, rnd) for w in self.wrappers))

    def branch_refusal(self) -> str | None:
        """Why a run of this strategy cannot branch from another run's checkpoint (one
        sentence), or ``None`` (the default: it can)."""
        return None

    def run_round(self, grid: Grid, server_round: int, train_config: ConfigRecord) -> dict[str, Any]:
        """One training round: configure, send, wait (with timeout), aggregate.

        A strategy with another loop (e.g. a chain of single-node hops) overrides
        this method and returns its round metrics.
        """
        assert self.params is not None
        self.configure_train(server_round, proto.to_record(self.params), train_config, grid)
        ex = self.last_exchange
        replies = self.exchange(grid, ex)
        replies = self.resend_lost(grid, server_round, replies, ex)
        _, metrics = self.aggregate_train(server_round, replies)
        return {k: float(v) for k, v in (metrics or {}).items()}  # type: ignore[arg-type]

    def exchange(self, grid: Grid, ex: Exchange) -> list[Message]:
        """Send ``ex``'s instructions, wait for the replies (``round_timeout``), count the
        traffic; the replies.  ``ex`` becomes :attr:`last_exchange`."""
        self.last_exchange = ex
        return exchange_ops.send(grid, ex, self.traffic, self.round_timeout, self.poll_interval)

    def resend_lost(self, grid: Grid, server_round: int, replies: list[Message],
                    ex: Exchange) -> list[Message]:
        """Ask again, up to ``transport_retries`` times, the nodes whose train reply was
        lost on the way (:func:`strategies.exchange.resend_lost`)."""
        return exchange_ops.resend_lost(
            grid, ex, replies, self.traffic, retries=self.transport_retries,
            timeout=self.round_timeout, poll_interval=self.poll_interval, label=self.label,
            server_round=server_round)

    def train_hop(
        self, grid: Grid, server_round: int, node_id: int, partition_id: int, params: Params,
        train_config: ConfigRecord | Mapping[str, Any] | None = None,
        models: Mapping[str, Params] | None = None,
    ) -> ClientUpdate | None:
        """Send ``params`` to one node, wait for its reply, validate it.

        The building block of sequential strategies (a chain of single-node hops,
        FedSeq / FedELMY): returns the validated update, or ``None`` after logging
        why the hop failed.
        """
        cfg = self.round_config(server_round, train_config or {})
        ex = Exchange({node_id: partition_id}, {node_id: params},
                      [proto.message(node_id, MessageType.TRAIN, params, cfg, models)])
        replies = self.last_replies = self.exchange(grid, ex)
        ok, _ = self.validate(replies, ex)
        return ok[0] if ok else None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run rounds ``self.round + 1 .. num_rounds`` (resumes after a checkpoint).

        As Flower's :meth:`Strategy.start`: ``num_rounds`` sets the schedule (and what
        depends on it: IMA's start round, a warmup given as a fraction), ``timeout``
        bounds each round's wait for replies, ``train_config`` and ``evaluate_config``
        reach the clients with their keys unchanged (see :meth:`round_config`), and
        ``evaluate_fn(round, arrays)`` evaluates the global model centrally, also
        before round 1.
        """
        self.prepare(num_rounds)
        self.round_timeout = float(timeout)
        train_config = train_config if train_config is not None else ConfigRecord()
        evaluate_config = evaluate_config if evaluate_config is not None else ConfigRecord()
        if self.params is None:
            self.params = proto.from_record(initial_arrays)
        self.discover(grid)
        self.summary()
        result = Result()
        self.evaluate_initial(evaluate_fn, result)
        for rnd in range(self.round + 1, self.num_rounds + 1):
            t0 = time.monotonic()
            train = {**self.run_round(grid, rnd, train_config), **self.traffic.totals()}
            if train.get("clients-ok", 0) > 0:
                self.usable_rounds += 1
            record: dict[str, Any] = {"round": rnd, **train}
            if self.evaluate_now(rnd):
                self.evaluate_round(grid, rnd, evaluate_config, evaluate_fn, result, record)
            result.train_metrics_clientapp[rnd] = proto.metric_record(
                {k: v for k, v in train.items() if isinstance(v, int | float)})
            self.round = rnd
            record["round-time"] = time.monotonic() - t0
            self._emit(record)
        if self.usable_rounds == 0 and self.round > 0:
            log(ERROR, "[%s] no round of the run used a reply: %d rounds, every train reply "
                "refused or missing (the last round's: %s); the model is the one it started "
                "from", self.label, self.round, why_refused(self.last_rejections))
        result.arrays = proto.to_record(self.params)
        return result

    def discover(self, grid: Grid) -> None:
        """Learn what the plan needs from the connected nodes before the first round
        (nothing here; a chain learns the partitions it visits)."""

    def evaluate_now(self, rnd: int) -> bool:
        """Whether round ``rnd`` ends with an evaluation (every round here)."""
        return True

    def evaluate_round(self, grid: Grid, rnd: int, evaluate_config: ConfigRecord,
                       evaluate_fn: EvaluateFn | None, result: Result,
                       record: dict[str, Any]) -> None:
        """Federated (``fed-*`` keys) and central evaluation of the current model into
        ``record`` and ``result``."""
        assert self.params is not None
        fed = self.aggregate_evaluate(rnd, transport.send_and_receive(
            grid, list(self.configure_evaluate(rnd, proto.to_record(self.params), evaluate_config, grid)),
            self.round_timeout, self.poll_interval)[0])
        if fed is not None:
            result.evaluate_metrics_clientapp[rnd] = fed
            record.update({f"fed-{k}": float(v) for k, v in fed.items()})  # type: ignore[arg-type]
        if evaluate_fn is not None:
            res = evaluate_fn(rnd, proto.to_record(self.params))
            if res is not None:
                result.evaluate_metrics_serverapp[rnd] = res
                record.update({k: float(v) for k, v in res.items()})  # type: ignore[arg-type]

    def evaluate_initial(self, evaluate_fn: EvaluateFn | None, result: Result) -> None:
        """Central evaluation of the starting model as round 0 (not after a resume)."""
        if self.round == 0 and evaluate_fn is not None:
            assert self.params is not None
            res = evaluate_fn(0, proto.to_record(self.params))
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
                self._emit({"round": 0, **{k: float(v) for k, v in res.items()},  # type: ignore[arg-type]
                            "round-time": 0.0})

    def progress(self, record: dict[str, Any]) -> str:
        """Where the run stands after ``record``, for the progress line."""
        return f"round {int(record['round'])}/{self.num_rounds}"

    def _emit(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        for hook in self.hooks:
            hook(self, record)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly."""
        return {
            "name": self.composition,
            "round": self.round,
            "params": copy(self.params) if self.params is not None else None,
            "history": [dict(h) for h in self.history],
            "usable_rounds": self.usable_rounds,
            **self.traffic.state(),
            "wrappers": {w.name: w.state_dict() for w in self.wrappers},
        }

    def checkpoint_written(self) -> None:
        """Called after a checkpoint holding :meth:`state_dict` was written
        (a disk cache may now drop files the previous checkpoint needed)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (also a checkpoint written before wrappers
        existed, where IMA was a strategy named ``ima`` with its windows under ``ima``)."""
        name = state.get("name")
        wrapped = state.get("wrappers")
        if wrapped is None and name == "ima" and [w.name for w in self.wrappers] == ["ima"]:
            name, wrapped = self.composition, {"ima": state["ima"]}
        if name != self.composition:
            raise ValueError(f"checkpoint is for strategy {state.get('name')!r}, not "
                             f"{self.composition!r}")
        self.round = int(state["round"])
        self.params = copy(state["params"]) if state["params"] is not None else None
        self.history = [dict(h) for h in state["history"]]
        self.usable_rounds = int(state.get("usable_rounds", self.round))
        self.traffic.load(state)
        for w in self.wrappers:
            w.load_state_dict((wrapped or {})[w.name])


__all__ = ["EVAL_TAG", "SAMPLE_TAG", "TRAFFIC_KEYS", "Builder", "ConfigError", "EvaluateFn", "FedsysStrategy",
           "NoOptions", "NoUsableUpdateError", "NodesUnavailableError", "RoundHook",
           "StrategyWrapper", "why_refused"]
