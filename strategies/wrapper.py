"""What acts on the models a strategy makes, whatever the strategy: a
:class:`StrategyWrapper` (IMA, the robust aggregators; later server-side DP), attached with
:meth:`strategies.base.FedsysStrategy.wrap`, into the strategy's
:class:`WrapperChain`.

A wrapper sees the strategy it wraps only as :class:`Wrapped` (its name and schedule), so
this module imports no strategy and any strategy can carry any wrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol, cast

from fedsys.params import Params, mean
from fedsys.validation import ClientUpdate, Rejection
from strategies.settings import RoundSettings


class Wrapped(Protocol):
    """What a wrapper may read of the strategy it wraps."""

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


class StrategyWrapper:
    """Acts on the models a strategy is about to send and evaluate (IMA, later a robust
    aggregator or server-side DP).

    Attach with :meth:`~strategies.base.FedsysStrategy.wrap`.  After each aggregation the
    strategy passes every model it has just made (its global model, or FedCross's changed
    slots; FedAdam/FedYogi their client mean before the optimiser step) through
    :meth:`transform` of each wrapper in order
    (:meth:`~strategies.base.FedsysStrategy.finish`).  A wrapper returns the model
    unchanged (the same object) when it does not act.
    """

    #: Name of the wrapper (its config prefix and its key in checkpoints).
    name: ClassVar[str] = "wrapper"
    #: Whether :meth:`combine` replaces the strategy's mean of the round's models.
    replaces_mean: ClassVar[bool] = False
    #: What the wrapper does about a model given to ``configure_train`` that is not the
    #: strategy's own (one line; empty: nothing of its own).
    foreign_model: ClassVar[str] = ""

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the wrapper's options (its name)."""
        return cls.name

    @classmethod
    def from_config(cls, cfg: Any, build: Callable[[str], Any] | None = None) -> Any:
        """The strategy named by the config key ``<name>.base``, built by ``build``, with this
        wrapper attached: the wrapper's registry entry (``strategy: ima`` with ``ima.base``)."""
        if build is None:
            raise ValueError(f"{cls.__name__}.from_config needs a builder for its base strategy")
        opts = cfg.fields_of(cls.name)
        return build(str(opts["base"])).wrap(cast(Any, cls)(**opts))

    def on_start(self, strategy: Wrapped, num_rounds: int) -> None:
        """Called by the strategy's ``start`` with the schedule's length."""

    def schedule_keys(self) -> list[str]:
        """The wrapper's options whose rounds follow the run's length (unset, or given as a
        fraction of it): what ``start``'s ``num_rounds`` (or ``prepare``) must fix."""
        return []

    def inert_options(self, strategy: Wrapped, num_rounds: int) -> list[str]:
        """What in this wrapper's options would leave it inert for ``num_rounds`` rounds
        (one sentence each, naming the key); the strategy's ``prepare`` refuses the run
        when there is any."""
        return []

    def transform(self, server_round: int, slot: int, model: Params) -> Params:
        """The model to send and evaluate instead of ``model`` (``slot``: which one)."""
        return model

    def combine(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None) -> Params | None:
        """A replacement for the mean of the round's ``models`` (``weights``: the
        strategy's, ``None`` for a uniform mean), the step each strategy names in its
        :meth:`~strategies.base.FedsysStrategy.average` calls; ``None``: the mean stays."""
        return None

    def screen(self, updates: list[ClientUpdate], references: Mapping[int, Params]
               ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """The validated updates as the strategy will use them (``references``: node ->
        the model it was sent), and those refused here."""
        return updates, []

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Keys this wrapper adds to every train instruction of ``server_round``."""
        return {}

    def branch_late_keys(self, strategy: Wrapped, rnd: int) -> frozenset[str]:
        """This wrapper's config keys that have not acted by the end of round ``rnd``
        (the strategy's ``branch_late_keys``)."""
        return frozenset()

    def client_lr(self, server_round: int, lr: float, lr_decay: float, current: float) -> float:
        """The client learning rate of ``server_round`` (``current``: the strategy's own)."""
        return current

    def round_metrics(self) -> dict[str, float]:
        """Metrics of the last round."""
        return {}

    def summary(self) -> None:
        """Log the wrapper's settings."""

    def state_dict(self) -> dict[str, Any]:
        """The wrapper's state, for exact resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class WrapperChain:
    """A strategy's wrappers, in the order they were attached, and what they do together:
    :meth:`finish` on the models the strategy makes, :meth:`average` in place of its mean
    of the round's models, :meth:`screen` on the validated updates, :meth:`metrics` into
    the round's record.  A strategy holds one (``strategy.wrappers``; empty: every call
    leaves the models as they are); iterating gives the wrappers."""

    def __init__(self) -> None:
        self.items: list[StrategyWrapper] = []

    def append(self, wrapper: StrategyWrapper) -> None:
        """Attach ``wrapper`` after the others."""
        self.items.append(wrapper)

    def __iter__(self) -> Iterator[StrategyWrapper]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> StrategyWrapper:
        return self.items[i]

    def finish(self, server_round: int, models: dict[int, Params]) -> dict[int, Params]:
        """Pass the models the strategy has just made through every wrapper.

        ``models`` maps a slot (0 for a single global model) to a model; each wrapper
        may return another model for a slot (see :class:`StrategyWrapper`).
        """
        for w in self.items:
            models = {i: w.transform(server_round, i, m) for i, m in sorted(models.items())}
        return models

    def average(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None = None) -> Params:
        """The mean of the round's models (weighted by ``weights``), or the first
        wrapper's replacement for it (:meth:`StrategyWrapper.combine`: a robust rule)."""
        for w in self.items:
            if w.replaces_mean and (got := w.combine(server_round, models, weights)) is not None:
                return got
        return mean(models, weights)

    @property
    def replaces_mean(self) -> bool:
        """Whether a wrapper replaces :meth:`average` (a strategy whose own mean takes a
        faster path, FedCDA's, then forms the models)."""
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
            current = w.client_lr(server_round, lr, lr_decay, current)
        return current

    def schedule_keys(self) -> list[str]:
        """Every wrapper's :meth:`StrategyWrapper.schedule_keys`."""
        return [k for w in self.items for k in w.schedule_keys()]

    def metrics(self) -> dict[str, float]:
        """Every wrapper's round metrics, in the order they were attached."""
        out: dict[str, float] = {}
        for w in self.items:
            out.update(w.round_metrics())
        return out


__all__ = ["StrategyWrapper", "Wrapped", "WrapperChain"]
