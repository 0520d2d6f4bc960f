"""What acts on the models a strategy makes, whatever the strategy: a
:class:`StrategyWrapper` (IMA; later a robust aggregator or server-side DP), attached with
:meth:`strategies.base.FedsysStrategy.wrap`.

A wrapper sees the strategy it wraps only as :class:`Wrapped` (its name and schedule), so
this module imports no strategy and any strategy can carry any wrapper.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from fedsys.params import Params


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

    def on_start(self, strategy: Wrapped, num_rounds: int) -> None:
        """Called by the strategy's ``start`` with the schedule's length."""

    def inert_options(self, strategy: Wrapped, num_rounds: int) -> list[str]:
        """What in this wrapper's options would leave it inert for ``num_rounds`` rounds
        (one sentence each, naming the key); the strategy's ``prepare`` refuses the run
        when there is any."""
        return []

    def transform(self, server_round: int, slot: int, model: Params) -> Params:
        """The model to send and evaluate instead of ``model`` (``slot``: which one)."""
        return model

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


__all__ = ["StrategyWrapper", "Wrapped"]
