"""The global model: what a round sends (:class:`GlobalModel`) and what a method makes of
a round (:class:`Aggregate`).

Flower's round semantics: the model a round sends is the
``arrays`` given to ``configure_train``.  :class:`GlobalModel` tells the strategy's own
model (the record it last made of it, or equal values) from a model the caller changed
between rounds (server-side fine-tuning, a restored checkpoint), which the strategy then
adopts as its :attr:`~strategies.rounds.RoundEngine.foreign_model` line says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from fedsys import protocol as proto
from fedsys.params import Params


@dataclass
class GlobalModel:
    """A strategy's global model and the record last made of it."""

    params: Params | None = None
    #: The record last made of :attr:`params` (:meth:`record`): a model given to
    #: ``configure_train`` that is this object is the strategy's own.
    own: ArrayRecord | None = None

    def record(self) -> ArrayRecord:
        """:attr:`params` as the record the round loop hands to ``configure_train``
        (remembered: that record is the strategy's own model)."""
        assert self.params is not None
        self.own = proto.to_record(self.params)
        return self.own

    def foreign(self, arrays: ArrayRecord) -> Params | None:
        """The model in ``arrays`` where it is not this one, else ``None`` (the record
        last made, or equal values); the first model given becomes this one."""
        if arrays is self.own and self.params is not None:
            return None
        given = proto.from_record(arrays)
        if self.params is None:
            self.params = given
            return None
        if given.keys() == self.params.keys() and all(
                np.array_equal(given[k], self.params[k]) for k in given):
            return None
        return given


@dataclass(frozen=True, eq=False)
class Aggregate:
    """What a method's ``aggregate`` returns, as Flower's ``aggregate_train`` does: the
    new global model (``None``: unchanged) and the method's own numbers of the round
    (reported in the round's record); ``model, metrics = aggregate`` unpacks as Flower's
    pair does.

    The engine passes it through the strategy's wrappers
    (:meth:`strategies.wrapper.WrapperChain.release`): ``model``, or the models
    ``wrapped`` names where the wrappers act on others (slot -> model: FedCross's changed
    slots), after which ``then(server_round, models, changed)`` makes the round's model
    of them (``changed``: a wrapper replaced one; FedCross's mean of its slots, FedAdam's
    server step from its client mean).
    """

    model: Params | None
    metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    wrapped: Mapping[int, Params] | None = None
    then: Callable[[int, dict[int, Params], bool], Params] | None = None

    def __iter__(self) -> Iterator[Any]:
        """The model and the metrics (``model, metrics = aggregate``)."""
        return iter((self.model, self.metrics))
