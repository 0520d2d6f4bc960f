"""The fedsys server base class, on Flower's message-API :class:`Strategy`.

Build a fedsys strategy like one of Flower's own::

    strategy = FedCDAStrategy(fraction_train=0.25, min_available_nodes=4, memory=3)
    result = strategy.start(grid, initial_arrays, num_rounds=50, timeout=600,
                            train_config=ConfigRecord({"lr": 0.01}), evaluate_fn=...)

Its keywords are the method's options, each a keyword of its class's constructor (typed,
with its default; ``memory``), and the settings every strategy takes, Flower's and
fedsys's (``**settings: Unpack[RoundSettingsKw]``, one value documented on
:class:`strategies.settings.RoundSettings`).  A method's options are also its config keys
(``fedcda.memory``), declared in its module as a frozen dataclass (``Options``) whose
fields are its constructor's keywords (a unit test holds them equal);
:meth:`FedsysStrategy.from_config` builds the same object from a fedsys run config.  The
strategy is composed of parts, each in a module of its own:

* what the method is and decides, its state and its hooks: :mod:`strategies.hooks`;
* Flower's API and a round over them: :mod:`strategies.rounds`; the loop of rounds,
  :mod:`strategies.loop`;
* its settings (:mod:`strategies.settings`), its nodes (:mod:`strategies.nodes`), one
  exchange of messages (:mod:`strategies.exchange`), the reply pipeline
  (:mod:`strategies.replies`), the global model (:mod:`strategies.model`), the wrappers
  (:mod:`strategies.wrapper`), the round's client metrics (:mod:`strategies.client_metrics`)
  and the state a checkpoint holds (:mod:`strategies.state`).

This class builds them from the settings and gives a method its tools (the mean a wrapper
may replace, :meth:`~FedsysStrategy.average`); a wrapper holds the strategy
(``IMA(FedAvgStrategy(), window=5)``, :mod:`strategies.wrapper`).  Pure maths lives in
:mod:`fedsys`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from logging import WARNING
from typing import TYPE_CHECKING, Any, Self, Unpack

from flwr.supercore import log

from fedsys.options import ConfigError
from fedsys.params import Params
from strategies.exchange import TRAFFIC_KEYS
from strategies.hooks import NoOptions
from strategies.loop import EvaluateFn, RoundHook
from strategies.model import Aggregate
from strategies.nodes import EVAL_TAG, SAMPLE_TAG, NodesUnavailableError
from strategies.replies import why_refused
from strategies.rounds import RoundEngine
from strategies.settings import (
    RoundSettings,
    RoundSettingsKw,
    config_options,
    config_settings,
    unexpected_keyword,
)
from strategies.state import engine_state, load_engine_state
from strategies.wrapper import StrategyWrapper, Traits

if TYPE_CHECKING:
    from fedsys.config import RunConfig

#: Builds a registered strategy by name from a run config (for composites like IMA).
Builder = Callable[[str], "FedsysStrategy"]


class NoUsableUpdateError(RuntimeError):
    """No round of a run produced a usable update (every reply was refused or missing)."""


class FedsysStrategy(RoundEngine):
    """Base class of every fedsys strategy (see the module docstring).

    Parameters
    ----------
    **settings
        The settings every strategy takes, Flower's keywords and fedsys's
        (:class:`~strategies.settings.RoundSettingsKw`; each documented, with its default, on
        :class:`strategies.settings.RoundSettings`).  A method's constructor takes its
        options as keywords of its own and hands the settings on.
    """

    def __init__(self, **settings: Unpack[RoundSettingsKw]) -> None:
        names = RoundSettings.names()
        for name in settings:
            if name not in names:  # a method's keyword spelt wrong lands here too
                own = [p.name for p in inspect.signature(type(self)).parameters.values()
                       if p.kind is inspect.Parameter.KEYWORD_ONLY]
                raise unexpected_keyword(type(self), name, [*own, *names])
        try:
            values = RoundSettings(**settings)
        except ConfigError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
        if values.skips_training:  # as Flower's FedAvg
            log(WARNING, "[%s] fraction_train is set to 0.0: federated training is skipped "
                "(no train message is sent), as on Flower's strategies", self.name)
        super().__init__(values, values.node_directory(self.tell_once),
                         values.reply_policy(self.name, self.required_metrics, self.tell_once))
        self.options = NoOptions()

    # ------------------------------------------------------------------ options

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the method's options."""
        return cls.option_prefix or cls.name

    @classmethod
    def from_config(cls, cfg: RunConfig, build: Builder | None = None) -> Self:
        """The strategy a fedsys run config describes: its settings and the method's
        options, by their keywords (``build`` makes other registered strategies by name,
        for composites)."""
        return cls(**config_settings(cfg), **config_options(cfg, cls.Options, cls.prefix()))

    # ------------------------------------------------------------------ wrappers

    @property
    def engine(self) -> Self:
        """The strategy that runs the rounds: this one (a wrapper's is the method it holds,
        :class:`strategies.wrapper.StrategyWrapper`)."""
        return self

    def average(self, server_round: int,
                models: Sequence[Params] | Callable[[], Sequence[Params]],
                weights: Sequence[float] | None = None,
                own: Callable[[], Params] | None = None) -> Params:
        """The method's mean of the round's models (weighted by ``weights``), which a
        wrapper may replace (a robust rule: :meth:`WrapperChain.average`): the one step
        inside a method a wrapper takes, declared by the method's ``traits.mean``.
        ``own`` computes the same mean the method's own way (a faster path), used where
        no wrapper replaces it; ``models`` may be a function giving them, called only
        where they are needed."""
        return self.wrappers.average(server_round, models, weights, own)

    def unwrapped(self) -> list[str]:
        """What the method sends to clients without passing it through its wrappers
        (one sentence each, naming the key that makes it so; none here): DP refuses it."""
        return []

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (:func:`strategies.state.engine_state`,
        and a method's own state under its name)."""
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (:func:`strategies.state.load_engine_state`)."""
        load_engine_state(self, state)


__all__ = [
    "EVAL_TAG",
    "SAMPLE_TAG",
    "TRAFFIC_KEYS",
    "Aggregate",
    "Builder",
    "ConfigError",
    "EvaluateFn",
    "FedsysStrategy",
    "NoOptions",
    "NoUsableUpdateError",
    "NodesUnavailableError",
    "RoundHook",
    "StrategyWrapper",
    "Traits",
    "why_refused",
]
