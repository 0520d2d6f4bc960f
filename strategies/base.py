"""The fedsys server base class, on Flower's message-API :class:`Strategy`.

Build a fedsys strategy like one of Flower's own::

    strategy = FedCDAStrategy(fraction_train=0.25, min_available_nodes=4, memory=3)
    result = strategy.start(grid, initial_arrays, num_rounds=50, timeout=600,
                            train_config=ConfigRecord({"lr": 0.01}), evaluate_fn=...)

Its keywords are the settings every strategy takes (Flower's and fedsys's, one value:
:class:`strategies.settings.RoundSettings`) and the method's options, declared once in its
module as a frozen dataclass (``Options``) whose fields are also its config keys
(``fedcda.memory``); :meth:`FedsysStrategy.from_config` builds the same object from a fedsys
run config.  The strategy is composed of parts, each in a module of its own:

* what the method is and decides, its state and its hooks: :mod:`strategies.hooks`;
* Flower's API and a round over them: :mod:`strategies.rounds`; the loop of rounds,
  :mod:`strategies.loop`;
* its settings (:mod:`strategies.settings`), its nodes (:mod:`strategies.nodes`), one
  exchange of messages (:mod:`strategies.exchange`), the reply pipeline
  (:mod:`strategies.replies`), the global model (:mod:`strategies.model`), the wrappers
  (:mod:`strategies.wrapper`), the round's client metrics (:mod:`strategies.client_metrics`)
  and the state a checkpoint holds (:mod:`strategies.state`).

This class builds them from the keywords and gives a method its tools (its wrappers'
:meth:`~FedsysStrategy.finish` and :meth:`~FedsysStrategy.average`); pure maths lives in
:mod:`fedsys`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from typing import TYPE_CHECKING, Any, Self

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
from strategies.settings import RoundSettings, config_kwargs, keywords, method_options
from strategies.state import engine_state, load_engine_state
from strategies.wrapper import StrategyWrapper

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
    **kwargs
        The settings every strategy takes (Flower's keywords and fedsys's, documented
        once: :class:`strategies.settings.RoundSettings`) and the method's own options
        (the fields of :attr:`Options`).
    """

    def __init__(self, **kwargs: Any) -> None:
        try:
            settings = RoundSettings.take(kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
        self.options = self.parse_options(kwargs)
        if settings.skips_training:  # as Flower's FedAvg
            log(WARNING, "[%s] fraction_train is set to 0.0: federated training is skipped "
                "(no train message is sent), as on Flower's strategies", self.name)
        super().__init__(settings, settings.node_directory(self.tell_once),
                         settings.reply_policy(self.name, self.required_metrics, self.tell_once))

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.__signature__ = keywords(cls)  # type: ignore[attr-defined]  # help() lists them

    # ------------------------------------------------------------------ options

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the method's options."""
        return cls.option_prefix or cls.name

    @classmethod
    def parse_options(cls, values: Mapping[str, Any]) -> Any:
        """Build :attr:`Options` from keyword arguments; a wrong name is a TypeError
        (:func:`strategies.settings.method_options`)."""
        return method_options(cls, values)

    @classmethod
    def config_kwargs(cls, cfg: RunConfig) -> dict[str, Any]:
        """Keyword arguments of the strategy from a fedsys run config."""
        return config_kwargs(cfg, cls.Options, cls.prefix())

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
    "why_refused",
]
