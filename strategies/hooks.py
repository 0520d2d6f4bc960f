"""What a fedsys method is and decides: the bottom of every fedsys strategy.

:class:`MethodHooks` holds a method's declarations (its ``name``, its client trainer, its
options' dataclass and config prefix, the reply metrics it needs), the state every part of
a strategy reads (set once by the constructor), and the hooks a round calls, each with its
default, each defined here once: which nodes a round samples (:meth:`~MethodHooks.sample`),
the model each is sent (:meth:`~MethodHooks.payload_for`), the round's aggregate
(:meth:`~MethodHooks.aggregate`), a model the caller changed between rounds
(:meth:`~MethodHooks.adopt`), a plan of its own (:meth:`~MethodHooks.discover`, ...), and
the schedule: the run's length and what follows from it (:meth:`~MethodHooks.prepare`), a
round's train settings and learning rate (:meth:`~MethodHooks.round_config`), branching.
A method overrides the hooks it needs; Flower's API over them is
:class:`strategies.rounds.RoundEngine`'s, the strategy built from its keywords
:class:`strategies.base.FedsysStrategy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any, ClassVar

from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys.options import ConfigError
from fedsys.params import Params
from fedsys.validation import ClientUpdate
from strategies.exchange import Exchange, Traffic
from strategies.model import Aggregate, GlobalModel
from strategies.nodes import SAMPLE_TAG, NodeDirectory
from strategies.replies import ReplyPolicy, Verdict
from strategies.settings import RoundSettings
from strategies.wrapper import Traits, WrapperChain


@dataclass(frozen=True)
class NoOptions:
    """A method without options of its own."""


class MethodHooks(Strategy):
    """A method's declarations, its state and its hooks (see the module docstring).

    Parameters
    ----------
    settings : RoundSettings
        The strategy's keywords (:class:`strategies.settings.RoundSettings`, documented
        there once).
    nodes : NodeDirectory
        Who the nodes are and which a round samples.
    replies : ReplyPolicy
        Which train replies are usable (the reply pipeline's settings).
    """

    #: The method's name: its registry key and config-key prefix, in the logs and checkpoints.
    name: ClassVar[str] = "base"
    #: The client trainer the method's instructions name where ``trainer`` is ``auto``.
    default_trainer: ClassVar[str] = "sgd"
    #: The method's options (a frozen dataclass of :func:`fedsys.options.option` fields).
    Options: ClassVar[type] = NoOptions
    #: Whether every train instruction names :attr:`default_trainer` (``trainer``): a method
    #: whose local training is its own and has no key of Flower's (FedELMY's pool); one that
    #: trains as Flower's clients do, or says so by Flower's key (FedProx's ``proximal-mu``),
    #: sends what Flower's strategy sends.
    names_trainer: ClassVar[bool] = False
    #: Config-key prefix of :attr:`Options` (empty: the strategy's ``name``).
    option_prefix: ClassVar[str] = ""
    #: Reply metrics the method cannot work without (besides ``weighted_by_key``): the
    #: keyword naming each (``"train_loss_key"``) and why the method needs it.
    required_metrics: ClassVar[dict[str, str]] = {}
    #: Write a checkpoint after every round whatever ``checkpoint-every`` says (a chain's hops).
    checkpoint_each_round: ClassVar[bool] = False
    #: What a model given to ``configure_train`` that is not the strategy's own does (a
    #: round loop of the caller's that changed it between rounds): one line, said in the
    #: log when it happens and in the docs; a strategy whose state is more than one model
    #: says what it does with the rest, and does it in :meth:`adopt`.
    foreign_model: ClassVar[str] = "it becomes the global model the round sends"
    #: What a wrapper must know of the method (how a round asks its clients, the mean a
    #: robust rule may replace, why DP cannot account it): :class:`strategies.wrapper.Traits`.
    traits: ClassVar[Traits] = Traits()
    #: The method's options, an instance of :attr:`Options` (set by the constructor).
    options: Any

    def __init__(self, settings: RoundSettings, nodes: NodeDirectory, replies: ReplyPolicy) -> None:
        #: The name a run gives this strategy in the logs (``start``'s ``label``).
        self.run_label = ""
        self._told: set[str] = set()  # what tell_once has told
        self.settings = settings
        self.nodes = nodes
        self.replies = replies
        self.num_rounds = 0
        self.round_timeout = 3600.0
        self.round = 0
        #: The global model (:attr:`params`) under Flower's round semantics.
        self.model = GlobalModel()
        #: What acts on the models the strategy makes (IMA, robust rules, DP), in the order
        #: they were applied (each wrapper holding the strategy joins it: strategies.wrapper).
        self.wrappers = WrapperChain()
        self.poll_interval = 0.1
        self.history: list[dict[str, Any]] = []
        #: The exchange of training messages under way (Flower's ``configure_train``
        #: makes it, ``aggregate_train`` judges its replies: Flower calls them apart).
        self.outgoing = Exchange()
        #: The last exchange's replies, judged (:func:`strategies.replies.judge`).
        self.verdict = Verdict()
        #: Update norms accepted in the last rounds or hops (the yardstick of a round of
        #: fewer than three replies, :func:`strategies.replies.bound`; in the checkpoint).
        self.update_norms: list[float] = []
        self.usable_rounds = 0
        #: Training traffic so far; every round's record carries its totals.
        self.traffic = Traffic()

    # ------------------------------------------------------------------ identity

    @property
    def params(self) -> Params | None:
        """The global model (:attr:`model`'s)."""
        return self.model.params

    @params.setter
    def params(self, value: Params | None) -> None:
        self.model.params = value

    @property
    def trainer(self) -> str:
        """The client trainer of the method (its :attr:`default_trainer` where ``trainer`` is
        ``auto``): what a fedsys run names in its ``train_config``, and the instructions
        where :meth:`round_config` says."""
        return self.default_trainer if self.settings.trainer == "auto" else self.settings.trainer

    @property
    def label(self) -> str:
        """How the logs name the strategy: the run's label for it where ``start`` was
        given one (``fedavg-trainer-lss``, ``ima``: :attr:`run_label`), else its name with
        its wrappers (``fedavg+ima``)."""
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

    # ------------------------------------------------------------------ the round's choices

    def sample(self, grid: Grid, server_round: int, k: int | None, tag: int = SAMPLE_TAG) -> dict[int, int]:
        """Pick ``k`` nodes (``{node_id: partition_id}``): :meth:`NodeDirectory.sample`
        (``k=None``: Flower's rule, ``fraction_train`` of the connected nodes, at least
        ``min_train_nodes``).  A method with its own draw overrides this."""
        return self.nodes.sample(grid, server_round, k, self.label, self.round_timeout,
                                 self.poll_interval, tag)

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        """The model sent to one node (the global model; FedCross overrides)."""
        assert self.params is not None
        return self.params

    def payload_models(self, node_id: int, partition_id: int, server_round: int) -> dict[str, Params]:
        """Further named models sent to one node (anchors; none here)."""
        return {}

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """The new global model from the round's accepted updates, and the method's own
        numbers of the round (subclasses)."""
        raise NotImplementedError

    def foreign_model_note(self) -> str:
        """The method's :attr:`foreign_model`, then each wrapper's."""
        return "; ".join([self.foreign_model, *self.wrappers.foreign_model()])

    def adopt(self, params: Params) -> None:
        """Take ``params``, a model given to ``configure_train`` that is not the
        strategy's own, as :attr:`foreign_model` says."""
        self.params = params

    def discover(self, grid: Grid) -> None:
        """Learn what the plan needs from the connected nodes before the first round
        (nothing here; a chain learns the partitions it visits)."""

    def evaluate_now(self, rnd: int) -> bool:
        """Whether round ``rnd`` ends with an evaluation (every round here)."""
        return True

    def progress(self, record: dict[str, Any]) -> str:
        """Where the run stands after ``record``, for the progress line."""
        return f"round {int(record['round'])}/{self.num_rounds}"

    # ------------------------------------------------------------------ schedule

    def client_lr(self, server_round: int, lr: float) -> float:
        """Client learning rate of ``server_round`` from the caller's ``lr``
        (:meth:`WrapperChain.client_lr`: ``lr_decay``, then the wrappers' schedules)."""
        return self.wrappers.client_lr(server_round, lr, self.settings.lr_decay)

    def round_config(self, server_round: int, config: ConfigRecord | Mapping[str, Any]) -> dict[str, Any]:
        """The train settings of one round, as Flower's strategies send them: the caller's
        keys, unchanged, plus ``server-round``, plus what the method and its wrappers need
        (DP's clipping norm in client mode; ``trainer`` where :attr:`names_trainer` or the
        ``trainer`` keyword asks, unless the caller gives one); a caller's ``lr`` follows
        the learning-rate schedule (``lr_decay``, wrappers).  A fedsys run names its trainer
        in the ``train_config`` it hands to ``start``."""
        out: dict[str, Any] = dict(config)
        out[proto.SERVER_ROUND] = server_round
        if self.names_trainer or self.settings.trainer != "auto":
            out.setdefault(proto.TRAINER, self.trainer)
        out.update(self.wrappers.train_config(server_round))
        if proto.LR in out:
            out[proto.LR] = self.client_lr(server_round, float(out[proto.LR]))
        return out

    def schedule_keys(self) -> list[str]:
        """The options (the method's and its wrappers') whose rounds follow the run's
        length: unset, or given as a fraction of it (FedCDA's warmup, IMA's start)."""
        return [*self.method_schedule_keys(), *self.wrappers.schedule_keys()]

    def method_schedule_keys(self) -> list[str]:
        """The method's own :meth:`schedule_keys` (none here)."""
        return []

    def prepare(self, num_rounds: int) -> None:
        """Fix the schedule's length (what depends on it: a warmup given as a fraction,
        a wrapper's start round).  :meth:`start` calls it with its ``num_rounds``."""
        self.num_rounds = int(num_rounds)
        self.on_start(self.num_rounds)
        wrapped = self.wrappers.on_start(self.num_rounds)
        inert = [*self.inert_options(self.num_rounds), *wrapped]
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
        (``branch-from``, :func:`fedsys_launch.apps.strategy_start.branch_point`).  The strategy's own
        (none by default) and its wrappers'."""
        return self.wrappers.branch_late_keys(rnd)

    def branch_refusal(self) -> str | None:
        """Why a run of this strategy cannot branch from another run's checkpoint (one
        sentence), or ``None`` (the default: it can)."""
        return None

    # ------------------------------------------------------------------ report and state

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.settings
        per_round = (f"{s.clients_per_round}" if s.clients_per_round is not None
                     else f"fraction {s.fraction_train:g} (>= {s.min_train})")
        log(INFO, "[%s] %d rounds, %s clients per round, trainer=%s, seed=%d, options %s",
            self.label, self.num_rounds, per_round, self.trainer, s.seed, self.options)
        self.wrappers.summary()

    def checkpoint_written(self) -> None:
        """Called after a checkpoint holding :meth:`state_dict` was written
        (a disk cache may now drop files the previous checkpoint needed)."""
