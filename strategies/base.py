"""The fedsys server base class, on Flower's message-API :class:`Strategy`.

Build a fedsys strategy like one of Flower's own::

    strategy = FedCDAStrategy(fraction_train=0.25, min_available_nodes=4, memory=3)
    result = strategy.start(grid, initial_arrays, num_rounds=50, timeout=600,
                            train_config=ConfigRecord({"lr": 0.01}), evaluate_fn=...)

Keyword arguments are Flower's usual ones, a few of fedsys's and the method's own
options, declared once in its module as a frozen dataclass (:attr:`FedsysStrategy.Options`)
whose fields are also its config keys (``fedcda.memory``); :meth:`FedsysStrategy.from_config`
builds the same object from a fedsys run config.  The base holds what a method decides:
its options, its wrappers (:mod:`strategies.wrapper`: IMA), which nodes a round samples,
the learning-rate schedule, the hooks a method overrides (:meth:`~FedsysStrategy.aggregate`;
:meth:`~FedsysStrategy.payload_for` for a model per node; ``run_round`` for another loop, a
chain's hops), the schedule's checks and the state (:meth:`~FedsysStrategy.state_dict`).
How rounds run is :class:`strategies.rounds.RoundEngine`'s (Flower's message API, a
round, a hop) and :class:`strategies.loop.RoundLoop`'s (Flower's template ``start``), on
the parts in modules of their own: the nodes
(:mod:`strategies.nodes`: partition-ids a node reports, one QUERY per node only with
``query_partitions=True``), one exchange of messages with its resends and traffic
(:mod:`strategies.exchange`) and which replies are usable (the reply pipeline,
:mod:`strategies.replies`: error replies, missing keys, shape or dtype mismatch, NaN or Inf,
a metric the method needs, the bounds; each refusal logged, the round goes on).  Pure maths lives in :mod:`fedsys`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys.options import ConfigError, parse_group, suggest
from fedsys.params import Params, copy
from strategies.client_metrics import MetricsAggrFn
from strategies.exchange import TRAFFIC_KEYS
from strategies.loop import EvaluateFn, RoundLoop
from strategies.nodes import EVAL_TAG, SAMPLE_TAG, NodeDirectory, NodesUnavailableError
from strategies.replies import ReplyPolicy, why_refused
from strategies.rounds import RoundEngine
from strategies.wrapper import StrategyWrapper

if TYPE_CHECKING:
    from fedsys.config import RunConfig

RoundHook = Callable[["FedsysStrategy", dict[str, Any]], None]
#: Builds a registered strategy by name from a run config (for composites like IMA).
Builder = Callable[[str], "FedsysStrategy"]


class NoUsableUpdateError(RuntimeError):
    """No round of a run produced a usable update (every reply was refused or missing)."""


@dataclass(frozen=True)
class NoOptions:
    """A method without options of its own."""


class FedsysStrategy(RoundEngine):
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
    max_update_ratio : float, default 20.0
        A reply whose update (its model minus the model it was sent) has an L2 norm
        above this many times the median of the round's other updates (three replies or
        more), else of the last updates accepted before (a chain's earlier hops), is
        refused with the numbers (:func:`fedsys.validation.norm_refusals`; 0: no bound).
    max_weight_share : float, default 0.5
        From two replies on, the claimed ``num-examples`` that would give a reply more
        than this share of an example-weighted mean are cut to one level at which each
        has this share after every cut (water-filling; below ``1/n`` for n replies, equal
        weights) and logged (:func:`fedsys.validation.capped_claims`; 0 or 1: no cap).
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
        answers queries, :mod:`fedsys_launch.client_app`).
    train_loss_key : str, default "train_loss"
        The train-reply metric holding the client's training loss (the name Flower's
        app template reports and Flower's ``QFedAvg`` reads; fedsys's own ClientApp
        reports ``train-loss``); the round's example-weighted mean is reported under
        the same name.
    weighted_by_key : str, default "num-examples"
        The train-reply metric holding the number of examples an update is weighted by
        (Flower's ``weighted_by_key``); a reply without it is refused.
    arrayrecord_key, configrecord_key : str, default "arrays", "config"
        Flower's keywords: the names an instruction's model and settings travel under.
        A reply's model is read under ``arrayrecord_key``, else as its one ArrayRecord
        whatever its name (Flower's rule; ``model.<name>`` records are a method's extra
        models), its metrics from its one MetricRecord, whatever its name; its
        ConfigRecords are the client's own and not read.
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn : callable, optional
        Flower's keywords: ``fn(contents, weighted_by_key) -> MetricRecord``, the round's
        client metrics from the used train replies' (the evaluate replies') contents,
        reported beside the round's own (``clients-ok``, the training loss, ...).
        Without one, Flower's default: every metric all used replies report, averaged
        weighted by their examples.
    **options
        The method's own options (the fields of :attr:`Options`).
    """

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
        max_update_ratio: float = 20.0,
        max_weight_share: float = 0.5,
        transport_retries: int = 1,
        query_partitions: bool = False,
        train_loss_key: str = proto.FLOWER_TRAIN_LOSS,
        weighted_by_key: str = proto.NUM_EXAMPLES,
        arrayrecord_key: str = proto.ARRAYS,
        configrecord_key: str = proto.CONFIG,
        train_metrics_aggr_fn: MetricsAggrFn | None = None,
        evaluate_metrics_aggr_fn: MetricsAggrFn | None = None,
        **options: Any,
    ) -> None:
        for kw, name in (("arrayrecord_key", arrayrecord_key), ("configrecord_key", configrecord_key)):
            if not str(name) or str(name).startswith(proto.MODEL_PREFIX):
                raise ConfigError(f"{type(self).__name__}: {kw}={name!r}: a record name, not empty "
                                  f"and not starting with {proto.MODEL_PREFIX!r} (a method's extra "
                                  f"models travel under that prefix)")
        self.options = self.parse_options(options)
        self.fraction_train = float(fraction_train)
        self.min_train_nodes = int(min_train_nodes)
        if self.fraction_train == 0.0 and clients_per_round is None:  # as Flower's FedAvg
            self.min_train_nodes = 0
            log(WARNING, "[%s] fraction_train is set to 0.0: federated training is skipped "
                "(no train message is sent), as on Flower's strategies", self.name)
        self.min_available_nodes = int(min_available_nodes)
        self.seed = int(seed)
        self.node_wait_timeout = float(node_wait_timeout)
        self.num_partitions = num_partitions
        self.query_partitions = bool(query_partitions)
        self.max_examples_ratio = float(max_examples_ratio)
        self.max_update_ratio = float(max_update_ratio)
        self.max_weight_share = float(max_weight_share)
        keys = {"train_loss_key": str(train_loss_key), "weighted_by_key": str(weighted_by_key)}
        super().__init__(
            nodes=NodeDirectory(  # who the nodes are and which a round samples
                seed=self.seed, fraction_train=self.fraction_train,
                min_train_nodes=self.min_train_nodes, min_available_nodes=self.min_available_nodes,
                wait_timeout=self.node_wait_timeout, query=self.query_partitions,
                num_partitions=num_partitions, tell=self.tell_once),
            replies=ReplyPolicy(  # which train replies the method uses
                self.name, keys["weighted_by_key"], keys["train_loss_key"],
                self.max_examples_ratio, self.max_update_ratio, self.max_weight_share,
                {keys[kw]: (kw, why) for kw, why in self.required_metrics.items()},
                self.tell_once, arrays_key=str(arrayrecord_key)),
            clients_per_round=clients_per_round, fraction_evaluate=fraction_evaluate,
            min_evaluate_nodes=min_evaluate_nodes, transport_retries=transport_retries,
            arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
            trainer=self.default_trainer if trainer == "auto" else trainer, lr_decay=lr_decay,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn, **keys)
        self.workdir: Path | None = None

    # ------------------------------------------------------------------ options

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the method's options."""
        return cls.option_prefix or cls.name

    @classmethod
    def parse_options(cls, values: Mapping[str, Any]) -> Any:
        """Build :attr:`Options` from keyword arguments; a wrong name is a TypeError."""
        names = [f.name for f in dataclasses.fields(cls.Options)]
        common = [p for f in (FedsysStrategy.__init__, cls.__init__)
                  for p in inspect.signature(f).parameters if p not in ("self", "options", "kwargs")]
        common += list(getattr(cls, "FLOWER_NAMES", {}))  # Flower's names of the options
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
            "max_update_ratio": cfg.max_update_ratio,
            "max_weight_share": cfg.max_weight_share,
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

    # ------------------------------------------------------------------ wrappers

    def wrap(self, wrapper: StrategyWrapper) -> Self:
        """Attach a :class:`StrategyWrapper` (after any attached before); returns ``self``."""
        self.wrappers.append(wrapper)
        return self

    def finish(self, server_round: int, models: dict[int, Params]) -> dict[int, Params]:
        """The models the method has just made, through its wrappers
        (:meth:`WrapperChain.finish`): what a method's :meth:`aggregate` returns."""
        return self.wrappers.finish(server_round, models)

    def average(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None = None) -> Params:
        """The method's mean of the round's models, or a wrapper's rule in its place
        (:meth:`WrapperChain.average`)."""
        return self.wrappers.average(server_round, models, weights)

    def summary(self) -> None:
        """Log the strategy's settings."""
        per_round = (f"{self.clients_per_round}" if self.clients_per_round is not None
                     else f"fraction {self.fraction_train:g} (>= {self.min_train_nodes})")
        log(INFO, "[%s] %d rounds, %s clients per round, trainer=%s, seed=%d, options %s",
            self.label, self.num_rounds, per_round, self.trainer, self.seed, self.options)
        for w in self.wrappers:
            w.summary()

    # ------------------------------------------------------------------ loop

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
        """Run rounds ``self.round + 1 .. num_rounds`` (resumes after a checkpoint): the
        round loop, :class:`strategies.loop.RoundLoop`.

        As Flower's :meth:`Strategy.start`: ``num_rounds`` sets the schedule (and what
        depends on it: IMA's start round, a warmup given as a fraction), ``timeout``
        bounds each round's wait for replies, ``train_config`` and ``evaluate_config``
        reach the clients with their keys unchanged (see :meth:`round_config`), and
        ``evaluate_fn(round, arrays)`` evaluates the global model centrally, also
        before round 1.
        """
        return RoundLoop(self, grid, timeout, train_config, evaluate_config,
                         evaluate_fn).run(initial_arrays, num_rounds)

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
        (``branch-from``, :func:`fedsys_launch.lifecycle.branch_point`).  The strategy's own
        (none by default) and its wrappers'."""
        return frozenset().union(*(w.branch_late_keys(self, rnd) for w in self.wrappers))

    def branch_refusal(self) -> str | None:
        """Why a run of this strategy cannot branch from another run's checkpoint (one
        sentence), or ``None`` (the default: it can)."""
        return None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly."""
        return {
            "name": self.composition,
            "round": self.round,
            "params": copy(self.params) if self.params is not None else None,
            "history": [dict(h) for h in self.history],
            "usable_rounds": self.usable_rounds,
            "update_norms": list(self.update_norms),
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
        self.update_norms = [float(v) for v in state.get("update_norms", [])]
        self.traffic.load(state)
        for w in self.wrappers:
            w.load_state_dict((wrapped or {})[w.name])


__all__ = ["EVAL_TAG", "SAMPLE_TAG", "TRAFFIC_KEYS", "Builder", "ConfigError", "EvaluateFn", "FedsysStrategy",
           "NoOptions", "NoUsableUpdateError", "NodesUnavailableError", "RoundHook",
           "StrategyWrapper", "why_refused"]
