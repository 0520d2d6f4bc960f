"""The fedsys run configuration: one typed, frozen object parsed once.

Layers, later ones win:

1. the defaults below, which are also the ``[tool.flwr.app.config]`` table of
   ``pyproject.toml`` (a unit test keeps the two identical);
2. Flower's ``context.run_config`` (``flwr run --run-config``);
3. a YAML experiment file (``configs/*.yaml``), flat or nested keys;
4. ``--set key=value`` overrides on the ``fedsys`` command line.

Keys are Flower-style kebab case; nested YAML tables become dotted keys
(``fedprox: {mu: 0.1}`` is ``fedprox.mu``).  An unknown key or a bad value raises
:class:`ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Scalar = bool | int | float | str


class ConfigError(ValueError):
    """A configuration key or value was rejected."""


@dataclass(frozen=True)
class Option:
    """One configuration key: its type, default, allowed values and help text."""

    key: str
    type: type
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], bool] | None = None
    rule: str = ""


def _pos(x: Any) -> bool:
    return bool(x > 0)


def _nonneg(x: Any) -> bool:
    return bool(x >= 0)


def _unit(x: Any) -> bool:
    return bool(0.0 <= x <= 1.0)


# The registries are filled by strategies/ and clients/; the names are listed here
# so the config can be validated without importing torch or flwr.
STRATEGIES = ("fedavg", "fedprox")
TRAINERS = ("auto", "sgd", "fedprox")
DATASETS = ("fashion-mnist", "cifar10", "cifar100", "synthetic")
MODELS = ("fmnist-cnn", "cifar-cnn", "resnet18", "mlp")

OPTIONS: tuple[Option, ...] = (
    # run
    Option("name", str, "default", "Run name; results go to <output-dir>/<name>/."),
    Option("output-dir", str, "runs", "Directory holding run directories (made absolute)."),
    Option(
        "strategy", str, "fedavg,fedprox",
        "Strategy, or a comma-separated list run one after another on identical "
        "partitions and seeds.", choices=STRATEGIES,
    ),
    Option("seed", int, 0, "The one seed: partitions, sampling, init and training."),
    Option("num-server-rounds", int, 30, "Federated rounds.", check=_pos, rule="> 0"),
    Option("clients-per-round", int, 5, "Nodes sampled per round.", check=_pos, rule="> 0"),
    Option("min-available-clients", int, 1,
           "Fewest connected nodes a round may start with once node-wait-timeout has "
           "passed (a round first waits for clients-per-round nodes).",
           check=_pos, rule="> 0"),
    Option("node-wait-timeout", float, 120.0,
           "Seconds to wait for enough nodes before giving up.", check=_pos, rule="> 0"),
    Option("round-timeout", float, 600.0,
           "Seconds to wait for the replies of one round.", check=_pos, rule="> 0"),
    Option("resume", bool, False, "Continue from the run directory's checkpoint."),
    Option("checkpoint-every", int, 1, "Write a checkpoint every k rounds.", check=_pos,
           rule="> 0"),
    # data
    Option("dataset", str, "fashion-mnist", "Dataset.", choices=DATASETS),
    Option("data-dir", str, "", "Data root searched first (empty: $FEDSYS_DATA, system)."),
    Option("num-clients", int, 20, "Partitions (simulated clients).", check=_pos, rule="> 0"),
    Option("partition", str, "dirichlet", "Partitioner.", choices=("iid", "dirichlet", "shards")),
    Option("dirichlet-alpha", float, 0.3, "Dirichlet concentration.", check=_pos, rule="> 0"),
    Option("dirichlet-min-size", int, 10, "Smallest client under Dirichlet.",
           check=_nonneg, rule=">= 0"),
    Option("shards-per-client", int, 2, "Label shards per client.", check=_pos, rule="> 0"),
    Option("test-subset", int, 0, "Evaluate on the first n test samples (0 = all).",
           check=_nonneg, rule=">= 0"),
    # model
    Option("model", str, "fmnist-cnn", "Model from the registry.", choices=MODELS),
    Option("model-norm", str, "bn", "ResNet-18 normalisation.", choices=("bn", "gn")),
    # local training
    Option("trainer", str, "auto",
           "Local trainer; 'auto' takes the strategy's own.", choices=TRAINERS),
    Option("local-epochs", int, 1, "Local epochs per round.", check=_pos, rule="> 0"),
    Option("local-steps", int, 0, "Cap on local SGD steps per round (0 = no cap).",
           check=_nonneg, rule=">= 0"),
    Option("batch-size", int, 32, "Local batch size.", check=_pos, rule="> 0"),
    Option("lr", float, 0.05, "Client learning rate.", check=_pos, rule="> 0"),
    Option("momentum", float, 0.0, "Client SGD momentum.", check=_unit, rule="in [0, 1]"),
    Option("weight-decay", float, 0.0, "Client L2 weight decay.", check=_nonneg, rule=">= 0"),
    Option("fedprox.mu", float, 0.01, "FedProx proximal coefficient mu.", check=_nonneg,
           rule=">= 0"),
    # evaluation
    Option("fraction-evaluate", float, 0.0,
           "Fraction of nodes asked for federated evaluation each round.",
           check=_unit, rule="in [0, 1]"),
    Option("eval-batch-size", int, 256, "Batch size of evaluation.", check=_pos, rule="> 0"),
    # resources
    Option("device", str, "auto", "Torch device for clients and server.",
           choices=("auto", "cpu", "cuda")),
    Option("client-num-cpus", float, 1.0, "CPUs per simulated client.", check=_pos,
           rule="> 0"),
    Option("client-num-gpus", float, 0.0,
           "GPUs per simulated client (fractions share a GPU).", check=_nonneg, rule=">= 0"),
    Option("torch-threads", int, 1, "torch intra-op threads per client (0 = torch default).",
           check=_nonneg, rule=">= 0"),
)

OPTION_BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}
DEFAULTS: dict[str, Scalar] = {o.key: o.default for o in OPTIONS}


def _field(key: str) -> str:
    return key.replace("-", "_").replace(".", "__")


@dataclass(frozen=True)
class RunConfig:
    """Resolved configuration of one run (every key of :data:`OPTIONS`).

    Attribute names are the keys in snake case, with ``.`` written ``__``
    (``fedprox.mu`` is ``fedprox__mu``).
    """

    name: str
    output_dir: str
    strategy: str
    seed: int
    num_server_rounds: int
    clients_per_round: int
    min_available_clients: int
    node_wait_timeout: float
    round_timeout: float
    resume: bool
    checkpoint_every: int
    dataset: str
    data_dir: str
    num_clients: int
    partition: str
    dirichlet_alpha: float
    dirichlet_min_size: int
    shards_per_client: int
    test_subset: int
    model: str
    model_norm: str
    trainer: str
    local_epochs: int
    local_steps: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    fedprox__mu: float
    fraction_evaluate: float
    eval_batch_size: int
    device: str
    client_num_cpus: float
    client_num_gpus: float
    torch_threads: int

    @property
    def strategies(self) -> list[str]:
        """The strategies of this run, in order."""
        return [s.strip() for s in self.strategy.split(",") if s.strip()]

    @property
    def run_dir(self) -> Path:
        """Absolute run directory ``<output-dir>/<name>``."""
        return Path(self.output_dir).expanduser().resolve() / self.name

    def to_dict(self) -> dict[str, Scalar]:
        """Return the flat kebab-case mapping (the Flower run-config form)."""
        return {o.key: getattr(self, _field(o.key)) for o in OPTIONS}

    def replace(self, **changes: Scalar) -> RunConfig:
        """Return a validated copy with kebab-case keys changed."""
        return build({**self.to_dict(), **changes})

    def save(self, path: Path) -> None:
        """Write the resolved config as YAML."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, OPTION_BY_KEY, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return hint + " Run 'fedsys keys' for the list of keys."


def coerce(key: str, value: Any) -> Scalar:
    """Convert and validate one value for ``key``; raise :class:`ConfigError`."""
    opt = OPTION_BY_KEY.get(key)
    if opt is None:
        raise ConfigError(f"unknown config key '{key}'.{_suggest(key)}")
    if key == "strategy" and isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    try:
        out: Scalar
        if opt.type is bool:
            if isinstance(value, bool):
                out = value
            elif str(value).lower() in ("true", "1", "yes", "on"):
                out = True
            elif str(value).lower() in ("false", "0", "no", "off"):
                out = False
            else:
                raise ValueError
        elif opt.type is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            out = int(value)
        elif opt.type is float:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if out != out or out in (float("inf"), float("-inf")):
                raise ValueError
        else:
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise ValueError
            out = str(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"config key '{key}' expects {opt.type.__name__}"
            f"{' ' + opt.rule if opt.rule else ''}, got {value!r}"
        ) from None
    if opt.choices is not None:
        names = [s.strip() for s in str(out).split(",")] if key == "strategy" else [str(out)]
        for n in names:
            if n not in opt.choices:
                raise ConfigError(
                    f"config key '{key}' got {n!r}; allowed values: {', '.join(opt.choices)}"
                )
    if opt.check is not None and not opt.check(out):
        raise ConfigError(f"config key '{key}' must be {opt.rule}, got {out!r}")
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys (``{a: {b: 1}}`` -> ``{'a.b': 1}``)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML experiment file into flat dotted keys."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return flatten(data)


def build(*layers: Mapping[str, Any]) -> RunConfig:
    """Merge ``layers`` over :data:`DEFAULTS`, validate, and return a frozen config."""
    merged: dict[str, Scalar] = dict(DEFAULTS)
    for layer in layers:
        for k, v in flatten(layer).items():
            merged[k] = coerce(k, v)
    if merged["clients-per-round"] > merged["num-clients"]:  # type: ignore[operator]
        raise ConfigError(
            f"config key 'clients-per-round' ({merged['clients-per-round']}) must be "
            f"<= num-clients ({merged['num-clients']})"
        )
    return RunConfig(**{_field(k): v for k, v in merged.items()})  # type: ignore[arg-type]


def load(
    yaml_path: Path | None = None,
    overrides: Iterable[str] = (),
    run_config: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Resolve a config from Flower's run config, a YAML file and overrides."""
    layers: list[Mapping[str, Any]] = [dict(run_config or {})]
    if yaml_path is not None:
        layers.append(load_yaml(yaml_path))
    layers.append(parse_overrides(overrides))
    return build(*layers)


def from_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Build the config inside a ServerApp or ClientApp from ``context.run_config``.

    ``run_simulation`` hands over an empty run config; the defaults then apply.
    """
    return build(dict(run_config))


def describe() -> str:
    """Return a table of every key, its default and what it allows."""
    rows = []
    for o in OPTIONS:
        allowed = ", ".join(o.choices) if o.choices else (o.rule or o.type.__name__)
        rows.append(f"  {o.key:24} {o.default!s:12} {allowed:28} {o.help}")
    return "\n".join(rows)


assert {_field(o.key) for o in OPTIONS} == {
    f.name for f in dataclasses.fields(RunConfig)
}, "RunConfig fields out of sync with OPTIONS"
