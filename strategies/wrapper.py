"""What acts on a strategy from outside, whatever the strategy: a :class:`StrategyWrapper`
(IMA, the robust rules, server-side DP) holds the strategy it wraps, as Flower's
``DifferentialPrivacyServerSideFixedClipping(strategy, ...)`` does, and is a strategy itself::

    strategy = IMA(FedAvgStrategy(fraction_train=0.1), window=5)
    strategy.start(grid, initial_arrays, num_rounds=50)

What a wrapper must know of a method is what the method declares (:class:`Traits`), never
its name.  The strategy at the bottom (its :attr:`~StrategyWrapper.engine`, the method)
runs the rounds and keeps its wrappers, in the order they were applied, in a
:class:`WrapperChain`: after the method's ``aggregate`` returns, the engine passes what it
made through every wrapper (:meth:`WrapperChain.release`), so a method calls nothing for
them; the one step a wrapper may take inside a method, a robust rule in place of the
method's mean of the round's models, is the mean the engine gives the method
(:meth:`strategies.base.FedsysStrategy.average`), which a method that has one declares
(``Traits.mean``).

This module imports no strategy: a wrapper sees the strategy it wraps as :class:`Wrapped`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsys.params import Params, mean
from fedsys.validation import ClientUpdate, Rejection
from strategies.model import Aggregate
from strategies.replies import ReplyPolicy
from strategies.settings import RoundSettings

#: How a method's round asks its clients (:attr:`Traits.asks`).
ASKS = ("sample", "all", "hop")
#: Which mean of the round's models a method takes (:attr:`Traits.mean`).
MEANS = ("round", "all", "none")


@dataclass(frozen=True)
class Traits:
    """What a wrapper must know of a method, declared by the method (its class attribute
    ``traits``), read by the wrappers: DP's accounting, the robust rules' refusals.

    Parameters
    ----------
    asks : {"sample", "all", "hop"}
        How a round asks the clients: a sample of them (``clients-per-round``, drawn each
        round: DP accounts the sampling), all at once (a parallel plan: no amplification),
        or one per hop of a chain (a client is released once in each pass).
    mean : {"round", "all", "none"}
        The mean of models the method takes through the engine's
        :meth:`~strategies.base.FedsysStrategy.average` (where a robust rule replaces
        it): of at most the round's replies (``clients-per-round`` models), of up to every
        partition's (FedCDA's selected models, a parallel plan's replies), or none (a
        chain relays one model).  ``round`` and ``all`` promise that every round with a
        model takes it, which the engine checks when a rule replaces it.
    private : str
        Why DP's accounting does not describe the method's release (one clause; empty:
        it does).
    """

    asks: str = "sample"
    mean: str = "all"
    private: str = ""

    def __post_init__(self) -> None:
        if self.asks not in ASKS or self.mean not in MEANS:
            raise ValueError(f"Traits(asks={self.asks!r}, mean={self.mean!r}): asks is one of "
                             f"{ASKS}, mean one of {MEANS}")

    @property
    def chain(self) -> bool:
        """Whether a round is one hop of a chain."""
        return self.asks == "hop"


class Wrapped(Protocol):
    """What a wrapper may read of the strategy at the bottom (its engine)."""

    @property
    def name(self) -> str:
        """The method's registry name (``fedcda``)."""
        ...

    @property
    def label(self) -> str:
        """How the logs name the strategy."""
        ...

    @property
    def settings(self) -> RoundSettings:
        """The strategy's settings (its seed, its clients per round, its partitions)."""
        ...

    @property
    def traits(self) -> Traits:
        """What the method declares of itself."""
        ...

    @property
    def wrappers(self) -> WrapperChain:
        """Its wrappers, in the order they were applied."""
        ...

    replies: ReplyPolicy
    nodes: Any
    estimator_fn: Any

    def unwrapped(self) -> list[str]:
        """What the method sends to clients without passing it through the wrappers."""
        ...


class StrategyWrapper(Strategy):
    """A strategy that holds another and acts on what it makes (see the module docstring).

    Built as ``Wrapper(strategy, **options)``; the wrapped strategy is then this one's:
    Flower's API (``start``, the round methods, ``summary``), ``state_dict`` /
    ``load_state_dict``, ``prepare``, ``label`` and every other attribute read are the
    strategy's, the wrappers' state included (an attribute of the strategy's state written
    here is written there), so a wrapper goes wherever a fedsys strategy goes and wraps
    again (``IMA(DP(FedAvgStrategy()))``).  Its :attr:`name` is its own (``ima``: its
    registry name and config prefix).

    What the engine asks of each wrapper (the hooks below, each with its default): after
    every aggregate the models the method made (its global model, FedCross's changed
    slots, FedAdam's client mean before its server step) through :meth:`transform` (the
    same object back where it does not act); with :attr:`replaces_mean`, :meth:`combine`
    in place of the method's mean; :meth:`screen` on the validated updates;
    :meth:`train_config` and :meth:`schedule_lr` on the instructions; :meth:`on_start`
    and :meth:`inert_options` once the run's length is known; its own state
    (:meth:`own_state`) in the strategy's checkpoint.  A subclass parses its options, calls
    ``super().__init__(strategy)`` and sets its own state in its ``__init__``, under names
    the strategy's state does not use (a name the strategy has and the wrapper has not set
    is written to the strategy).

    Parameters
    ----------
    strategy : FedsysStrategy or StrategyWrapper
        The strategy wrapped: a method, or a wrapper of one not wrapped since.
    """

    #: Name of the wrapper (its registry name, config prefix and key in checkpoints).
    name: ClassVar[str] = "wrapper"
    #: Whether :meth:`combine` replaces the method's mean of the round's models.
    replaces_mean: ClassVar[bool] = False
    #: What the wrapper does about a model given to ``configure_train`` that is not the
    #: strategy's own (one line; empty: nothing of its own).
    foreign_model: ClassVar[str] = ""

    def __init__(self, strategy: Any) -> None:
        engine = getattr(strategy, "engine", None)
        if engine is None or not isinstance(getattr(engine, "wrappers", None), WrapperChain):
            raise TypeError(f"{type(self).__name__}(strategy, ...) wraps a fedsys strategy "
                            f"(or a wrapper of one), not {type(strategy).__name__}")
        outer = engine.wrappers[-1] if len(engine.wrappers) else engine
        if strategy is not outer:
            raise TypeError(f"{type(self).__name__}: this strategy is wrapped already (by "
                            f"{type(outer).__name__}); wrap the outermost one")
        #: The strategy wrapped (a method, or the wrapper applied before this one).
        self.strategy = strategy
        #: The method at the bottom, which runs the rounds and calls the wrappers.
        self.engine: Wrapped = engine
        engine.wrappers.append(self)

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the wrapper's options (its name)."""
        return cls.name

    @classmethod
    def from_config(cls, cfg: Any, build: Callable[[str], Any] | None = None) -> Any:
        """The strategy named by the config key ``<name>.base``, built by ``build``, wrapped
        in this wrapper with its options: the wrapper's registry entry (``strategy: ima``
        with ``ima.base``)."""
        if build is None:
            raise ValueError(f"{cls.__name__}.from_config needs a builder for its base strategy")
        opts = cfg.fields_of(cls.name)
        return cast(Any, cls)(build(str(opts["base"])), **opts)

    # ------------------------------------------------------------------ the strategy's

    def __getattr__(self, name: str) -> Any:
        """Every other attribute read is the wrapped strategy's (``round``, ``params``,
        ``history``, ``nodes``, ``wrappers``, ...)."""
        strategy = self.__dict__.get("strategy")
        if strategy is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(strategy, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """An attribute of the strategy's state that this wrapper has not of its own
        (``poll_interval``, ``workdir``, ``run_label``, ``params``, ...) is written to the
        strategy; anything else is the wrapper's."""
        engine = self.__dict__.get("engine")
        if engine is not None and name not in self.__dict__ and (
                name in vars(engine) or isinstance(getattr(type(engine), name, None), property)):
            setattr(engine, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def label(self) -> str:
        """How the logs name the strategy (``fedavg+ima``)."""
        return cast(Any, self.engine).label

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The strategy's (the wrappers act inside it: :class:`WrapperChain`)."""
        return cast(Any, self.engine).configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The strategy's aggregate, through every wrapper."""
        return cast(Any, self.engine).aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The strategy's."""
        return cast(Any, self.engine).configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The strategy's."""
        return cast(Any, self.engine).aggregate_evaluate(server_round, replies)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              *, on_round: Sequence[Callable[[Any, dict[str, Any]], None]] = (),
              estimator_fn: Callable[[int, list[ClientUpdate], Params], dict[str, float]] | None = None,
              label: str = "") -> Result:
        """The strategy's ``start`` (fedsys's keywords as
        :meth:`strategies.rounds.RoundEngine.start`'s), every wrapper acting in each round."""
        return cast(Any, self.engine).start(grid, initial_arrays, num_rounds, timeout,
                                            train_config, evaluate_config, evaluate_fn,
                                            on_round=on_round, estimator_fn=estimator_fn,
                                            label=label)

    def summary(self) -> None:
        """The strategy's settings, then each wrapper's (:meth:`own_summary`)."""
        cast(Any, self.engine).summary()

    def prepare(self, num_rounds: int) -> None:
        """The strategy's (``start`` calls it): the wrappers' :meth:`on_start` and
        :meth:`inert_options` included."""
        cast(Any, self.engine).prepare(num_rounds)

    def state_dict(self) -> dict[str, Any]:
        """The strategy's state, every wrapper's own state in it (:meth:`own_state`)."""
        return cast(dict[str, Any], cast(Any, self.engine).state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        cast(Any, self.engine).load_state_dict(state)

    def schedule_keys(self) -> list[str]:
        """The strategy's (the method's and every wrapper's)."""
        return cast(list[str], cast(Any, self.engine).schedule_keys())

    def branch_late_keys(self, rnd: int) -> frozenset[str]:
        """The strategy's (the method's and every wrapper's)."""
        return cast(frozenset[str], cast(Any, self.engine).branch_late_keys(rnd))

    # ------------------------------------------------------------------ hooks

    def on_start(self, num_rounds: int) -> None:
        """Called when the strategy's schedule is fixed (``prepare``) with its length."""

    def own_schedule_keys(self) -> list[str]:
        """The wrapper's options whose rounds follow the run's length (unset, or given as a
        fraction of it): what ``start``'s ``num_rounds`` (or ``prepare``) must fix."""
        return []

    def inert_options(self, num_rounds: int) -> list[str]:
        """What in this wrapper's options, or in the composition, would leave it inert or
        unsound for ``num_rounds`` rounds (one sentence each, naming the key); the
        strategy's ``prepare`` refuses the run when there is any."""
        return []

    def transform(self, server_round: int, slot: int, model: Params) -> Params:
        """The model to send and evaluate instead of ``model`` (``slot``: which one)."""
        return model

    def combine(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None) -> Params | None:
        """A replacement for the mean of the round's ``models`` (``weights``: the
        method's, ``None`` for a uniform mean), the mean a method takes through
        :meth:`~strategies.base.FedsysStrategy.average`; ``None``: the mean stays."""
        return None

    def screen(self, updates: list[ClientUpdate], references: Mapping[int, Params]
               ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """The validated updates as the strategy will use them (``references``: node ->
        the model it was sent), and those refused here."""
        return updates, []

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Keys this wrapper adds to every train instruction of ``server_round``."""
        return {}

    def own_branch_late_keys(self, rnd: int) -> frozenset[str]:
        """This wrapper's config keys that have not acted by the end of round ``rnd``
        (part of the strategy's ``branch_late_keys``)."""
        return frozenset()

    def schedule_lr(self, server_round: int, lr: float, lr_decay: float, current: float) -> float:
        """The client learning rate of ``server_round`` (``current``: the strategy's own)."""
        return current

    def round_metrics(self) -> dict[str, float]:
        """Metrics of the last round."""
        return {}

    def own_summary(self) -> None:
        """Log the wrapper's settings."""

    def own_state(self) -> dict[str, Any]:
        """The wrapper's state, for exact resume (kept in the strategy's ``state_dict``)."""
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`own_state` output."""


class WrapperChain:
    """A strategy's wrappers, in the order they were applied, and what they do together:
    :meth:`release` on what the method made, :meth:`average` in place of its mean of the
    round's models, :meth:`screen` on the validated updates, :meth:`metrics` into the
    round's record.  The method at the bottom holds one (``strategy.wrappers``; empty:
    every call leaves the models as they are); iterating gives the wrappers."""

    def __init__(self) -> None:
        self.items: list[StrategyWrapper] = []
        #: Means taken through :meth:`average` since :meth:`release` last began a round.
        self.averaged = 0

    def append(self, wrapper: StrategyWrapper) -> None:
        """Apply ``wrapper`` after the others."""
        self.items.append(wrapper)

    def __iter__(self) -> Iterator[StrategyWrapper]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> StrategyWrapper:
        return self.items[i]

    def finish(self, server_round: int, models: Mapping[int, Params]) -> dict[int, Params]:
        """Pass the models a method has made through every wrapper's
        :meth:`StrategyWrapper.transform`, in order (``models``: slot -> model)."""
        out = dict(models)
        for w in self.items:
            out = {i: w.transform(server_round, i, m) for i, m in sorted(out.items())}
        return out

    def release(self, server_round: int, result: Aggregate) -> Aggregate:
        """What a method's ``aggregate`` returned, after the wrappers: its models
        (``result.wrapped``, else its model as slot 0) through :meth:`finish`, then the
        round's model made of them (``result.then``, told whether a wrapper replaced
        any; else slot 0)."""
        if result.model is None:
            return result
        given = dict(result.wrapped) if result.wrapped is not None else {0: result.model}
        done = self.finish(server_round, given)
        if result.then is None:
            return replace(result, model=done[0])
        changed = any(done[i] is not m for i, m in given.items())
        return replace(result, model=result.then(server_round, done, changed))

    def average(self, server_round: int, models: Sequence[Params] | Callable[[], Sequence[Params]],
                weights: Sequence[float] | None = None,
                own: Callable[[], Params] | None = None) -> Params:
        """The first wrapper's replacement for the mean of the round's ``models``
        (:meth:`StrategyWrapper.combine`: a robust rule), else the mean: ``own()``
        where the method has its own way to it, else :func:`fedsys.params.mean`.
        ``models`` may be a function giving them (only called where needed)."""
        self.averaged += 1
        for w in self.items:
            if w.replaces_mean:
                got = w.combine(server_round, models() if callable(models) else models, weights)
                if got is not None:
                    return got
        if own is not None:
            return own()
        return mean(models() if callable(models) else models, weights)

    @property
    def replaces_mean(self) -> bool:
        """Whether a wrapper replaces :meth:`average`."""
        return any(w.replaces_mean for w in self.items)

    def screen(self, updates: list[ClientUpdate], references: Mapping[int, Params]
               ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Pass the validated updates through every wrapper's :meth:`StrategyWrapper.screen`
        (``references``: node -> the model it was sent)."""
        refused: list[Rejection] = []
        for w in self.items:
            updates, more = w.screen(updates, references)
            refused += more
        return updates, refused

    def train_config(self, server_round: int) -> dict[str, Any]:
        """The keys every wrapper adds to the train instructions of ``server_round``."""
        return {k: v for w in self.items for k, v in w.train_config(server_round).items()}

    def client_lr(self, server_round: int, lr: float, lr_decay: float) -> float:
        """The client learning rate of ``server_round`` from the caller's ``lr``:
        ``lr * lr_decay^(round - 1)``, then each wrapper's schedule (IMA's late decay)."""
        current = float(lr * lr_decay ** (server_round - 1))
        for w in self.items:
            current = w.schedule_lr(server_round, lr, lr_decay, current)
        return current

    def schedule_keys(self) -> list[str]:
        """Every wrapper's :meth:`StrategyWrapper.own_schedule_keys`."""
        return [k for w in self.items for k in w.own_schedule_keys()]

    def on_start(self, num_rounds: int) -> list[str]:
        """Every wrapper's :meth:`StrategyWrapper.on_start`, then what each finds inert or
        unsound (:meth:`StrategyWrapper.inert_options`)."""
        for w in self.items:
            w.on_start(num_rounds)
        return [p for w in self.items for p in w.inert_options(num_rounds)]

    def branch_late_keys(self, rnd: int) -> frozenset[str]:
        """Every wrapper's :meth:`StrategyWrapper.own_branch_late_keys`."""
        return frozenset().union(*(w.own_branch_late_keys(rnd) for w in self.items))

    def foreign_model(self) -> list[str]:
        """Every wrapper's :attr:`StrategyWrapper.foreign_model` line."""
        return [w.foreign_model for w in self.items if w.foreign_model]

    def summary(self) -> None:
        """Every wrapper's :meth:`StrategyWrapper.own_summary`."""
        for w in self.items:
            w.own_summary()

    def metrics(self) -> dict[str, float]:
        """Every wrapper's round metrics, in the order they were applied."""
        out: dict[str, float] = {}
        for w in self.items:
            out.update(w.round_metrics())
        return out

    def state(self) -> dict[str, Any]:
        """Every wrapper's :meth:`StrategyWrapper.own_state`, by its name."""
        return {w.name: w.own_state() for w in self.items}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` output."""
        for w in self.items:
            w.load_own_state(state[w.name])


__all__ = ["ASKS", "MEANS", "StrategyWrapper", "Traits", "Wrapped", "WrapperChain"]
