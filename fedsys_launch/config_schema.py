"""The known methods, the config schema they make, and the config API.

Every config is built here (:func:`build`, :func:`load`, :func:`from_run_config`), checked
against the schema of the methods registered now; :mod:`fedsys.config` holds the types
and the schema-driven machinery they use.

Strategies are registered in :data:`strategies.REGISTRY`, trainers in
:data:`clients.TRAINERS`, one line each; their declared options, together with the
core keys, form the :class:`~fedsys.config.Schema` every config is checked against.
Modules named in the ``plugins`` key are imported first, so a method defined outside
fedsys registers itself with one line in its own module.

Imports neither torch nor Ray: ``fedsys keys`` and config validation stay fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from clients import TRAINERS
from fedsys import config as cfgmod
from fedsys import protocol as proto
from fedsys.attacks import AttackOptions
from fedsys.config import ConfigError, RunConfig, Schema
from fedsys.pretrain import PretrainOptions
from strategies import REGISTRY
from strategies.base import FedsysStrategy


def import_plugins(names: str | Iterable[str]) -> None:
    """Import the modules named in the ``plugins`` key (they register methods)."""
    items = names.split(",") if isinstance(names, str) else list(names)
    for name in (n.strip() for n in items):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"config key 'plugins': cannot import {name!r} ({exc})") from None


def schema() -> Schema:
    """The schema of the methods registered now (core keys + every declared option)."""
    groups: list[tuple[str, type]] = []
    for entry in [*REGISTRY.values(), *TRAINERS.values()]:
        if entry.Options.__dataclass_fields__:
            groups.append((entry.prefix(), entry.Options))
    groups.append(("pretrain", PretrainOptions))
    groups.append(("attack", AttackOptions))
    return Schema.assemble(tuple(REGISTRY), tuple(TRAINERS), groups)


def _plugins_of(layers: Iterable[Mapping[str, Any]]) -> str:
    found = ""
    for layer in layers:
        flat = cfgmod.flatten(layer)
        if "plugins" in flat:
            value = flat["plugins"]
            found = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return found


def build(*layers: Mapping[str, Any]) -> RunConfig:
    """:func:`fedsys.config.build` with the registered methods (plugins imported first)."""
    import_plugins(_plugins_of(layers))
    return cfgmod.build(*layers, schema=schema())


def load(yaml_path: Path | None = None, overrides: Iterable[str] = (),
         run_config: Mapping[str, Any] | None = None) -> RunConfig:
    """:func:`fedsys.config.load` with the registered methods (plugins imported first)."""
    layers: list[Mapping[str, Any]] = [dict(run_config or {})]
    if yaml_path is not None:
        layers.append(cfgmod.load_yaml(yaml_path))
    layers.append(cfgmod.parse_overrides(overrides))
    return build(*layers)


def from_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """The config inside a ServerApp or ClientApp (``context.run_config``)."""
    return build(dict(run_config))


def coerce(key: str, value: Any) -> cfgmod.Scalar:
    """``value`` of config key ``key``, typed and checked (:func:`fedsys.config.coerce`)."""
    return cfgmod.coerce(key, value, schema())


def describe() -> str:
    """A table of every key, its default and what it allows (``fedsys keys``)."""
    return cfgmod.describe(schema())


def describe_markdown() -> str:
    """:func:`describe` as a Markdown table (``fedsys keys --markdown``)."""
    return cfgmod.describe_markdown(schema())


def to_toml() -> str:
    """The defaults as ``pyproject.toml``'s run-config tables (``fedsys keys --toml``)."""
    return cfgmod.to_toml(schema())


def make_strategy(cfg: RunConfig) -> FedsysStrategy:
    """The strategy ``cfg`` names (one strategy: see :meth:`RunConfig.variants`): the method
    that runs the rounds, its wrappers applied (a wrapper's ``engine``)."""
    def builder(name: str) -> FedsysStrategy:
        return REGISTRY[name].from_config(cfg, builder)

    strategy = builder(cfg.strategy).engine
    strategy.prepare(cfg.num_server_rounds)
    return strategy


def train_config(cfg: RunConfig, trainer: str) -> dict[str, Any]:
    """The train settings the fedsys app hands to :meth:`FedsysStrategy.start`: the
    client trainer (``trainer``, what fedsys's ClientApp runs), the local-training keys and
    the options of ``trainer``, typed."""
    out: dict[str, Any] = {
        proto.TRAINER: trainer,
        proto.LR: cfg.lr,
        proto.LOCAL_EPOCHS: cfg.local_epochs,
        proto.LOCAL_STEPS: cfg.local_steps,
        proto.BATCH_SIZE: cfg.batch_size,
        proto.MOMENTUM: cfg.momentum,
        proto.OPTIMIZER: cfg.optimizer,
        proto.TRAINABLE: cfg.trainable,
        proto.WEIGHT_DECAY: cfg.weight_decay,
    }
    if trainer in TRAINERS:
        out.update(cfg.group(TRAINERS[trainer].prefix()))
    return out


__all__ = ["build", "coerce", "describe", "from_run_config", "import_plugins", "load",
           "make_strategy", "schema", "to_toml", "train_config"]
