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
STRATEGIES = ("fedavg", "fedprox", "fedcda", "fedcross", "fedadam", "fedyogi", "ima")
IMA_BASES = ("fedavg", "fedprox", "fedcda", "fedcross", "fedadam", "fedyogi")
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
    Option("keep-checkpoint", int, 0,
           "Also keep the checkpoint of this round as <strategy>/checkpoint-rNNNN.pt, a "
           "branch point for 'branch-from' (0: none).", check=_nonneg, rule=">= 0"),
    Option("branch-from", str, "",
           "Start from a kept checkpoint (<run>/<strategy>/checkpoint-rNNNN.pt) of a run "
           "that is identical up to that round, instead of from round 0: the earlier "
           "rounds' metrics are copied, the rest is trained.  Only keys that have not "
           "acted yet may differ (ima.average and ima.lr-decay before IMA starts)."),
    Option("save-models", str, "none",
           "Keep models for 'fedsys landscape': 'global' (each round's global model) or "
           "'all' (also every accepted client model) under <strategy>/models/.",
           choices=("none", "global", "all")),
    Option("save-models-from", int, 1, "First round whose models save-models keeps.",
           check=_pos, rule="> 0"),
    Option("estimators", bool, False,
           "Log per-round landscape estimators (IMA spec 3.4): largest and mean "
           "client-to-global distance, and the client models' loss on training data they "
           "do not hold."),
    Option("estimators-subset", int, 2000,
           "Samples of other clients' training data per client for the held-out loss.",
           check=_pos, rule="> 0"),
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
    Option("lr-decay", float, 1.0,
           "Per-round client lr decay gamma: lr_t = lr * gamma^t (t = round - 1; 1 = none).",
           check=lambda x: 0.0 < x <= 1.0, rule="in (0, 1]"),
    Option("momentum", float, 0.0, "Client SGD momentum.", check=_unit, rule="in [0, 1]"),
    Option("weight-decay", float, 0.0, "Client L2 weight decay.", check=_nonneg, rule=">= 0"),
    Option("fedprox.mu", float, 0.01, "FedProx proximal coefficient mu.", check=_nonneg,
           rule=">= 0"),
    # FedCDA (Wang et al., ICLR 2024)
    Option("fedcda.memory", int, 3, "FedCDA: K, recent local models cached per client.",
           check=_pos, rule="> 0"),
    Option("fedcda.batches", int, 3, "FedCDA: B, greedy selection batches per round (Eq. 8).",
           check=_pos, rule="> 0"),
    Option("fedcda.warmup", int, 50, "FedCDA: rounds run as FedAvg before selection starts.",
           check=_nonneg, rule=">= 0"),
    Option("fedcda.warmup-mode", str, "fedavg",
           "FedCDA warmup: 'fedavg' (paper) or 'newest-all' (uniform mean of every seen "
           "client's newest model, the public prototype's behaviour).",
           choices=("fedavg", "newest-all")),
    Option("fedcda.smoothness", float, 1.0, "FedCDA: L, the smoothness constant of Eq. 5.",
           check=_nonneg, rule=">= 0"),
    Option("fedcda.selection", str, "approximate",
           "FedCDA selection: approximate (Eq. 8), optimal (exhaustive Eq. 6 over all "
           "clients), newest, random (Fig. 2a ablation).",
           choices=("approximate", "optimal", "newest", "random")),
    Option("fedcda.cache", str, "ram",
           "FedCDA model cache: 'ram', or 'disk' (one file per cached model under the run "
           "directory, memory-mapped when read).", choices=("ram", "disk")),
    # FedCross (Hu et al., ICDE 2024)
    Option("fedcross.alpha", float, 0.99,
           "FedCross: cross-aggregation weight alpha (w_i = a v_i + (1-a) v_c(i)).",
           check=lambda x: 0.0 < x <= 1.0, rule="in (0, 1]"),
    Option("fedcross.selection", str, "lowest",
           "FedCross collaborative-model selection (CoModelSel).",
           choices=("lowest", "highest", "in-order")),
    Option("fedcross.similarity", str, "flat",
           "FedCross similarity: 'flat' cosine over all trainable parameters (paper) or "
           "'layer-pairs' (the authors' code).", choices=("flat", "layer-pairs")),
    Option("fedcross.warmup", int, 0,
           "FedCross: first rounds that reset every slot to the mean of the uploads "
           "(the code's first_stage_bound).", check=_nonneg, rule=">= 0"),
    Option("fedcross.propeller-rounds", int, 0,
           "FedCross: rounds (from the start) that use propeller models (0 = off).",
           check=_nonneg, rule=">= 0"),
    Option("fedcross.propellers", int, 2,
           "FedCross: propeller models per slot (in-order offsets).", check=_pos, rule="> 0"),
    Option("fedcross.propeller-beta", float, 0.0,
           "FedCross: own-model weight with propellers (0 = 1/(P+1), equal weights).",
           check=_unit, rule="in [0, 1]"),
    Option("fedcross.dynamic-alpha-rounds", int, 0,
           "FedCross: rounds over which alpha rises linearly from 0.5 to fedcross.alpha, "
           "starting after the propeller rounds (0 = off).", check=_nonneg, rule=">= 0"),
    # FedAdam / FedYogi server optimiser (Reddi et al., ICLR 2021)
    Option("fedopt.lr", float, 0.01, "FedAdam/FedYogi: server learning rate.", check=_pos,
           rule="> 0"),
    Option("fedopt.tau", float, 1e-3, "FedAdam/FedYogi: adaptivity tau.", check=_pos,
           rule="> 0"),
    Option("fedopt.beta1", float, 0.9, "FedAdam/FedYogi: first-moment decay.", check=_unit,
           rule="in [0, 1]"),
    Option("fedopt.beta2", float, 0.99, "FedAdam/FedYogi: second-moment decay.",
           check=_unit, rule="in [0, 1]"),
    Option("fedopt.bias-correction", bool, False,
           "FedAdam/FedYogi: Adam bias correction as Flower's legacy FedAdam (the IMA "
           "code uses none)."),
    # IMA (Zhou et al., iterative moving averaging of global models)
    Option("ima.base", str, "fedavg", "IMA: the strategy whose global models are averaged.",
           choices=IMA_BASES),
    Option("ima.window", int, 5, "IMA: P, global models in the moving-average window.",
           check=_pos, rule="> 0"),
    Option("ima.start-fraction", float, 0.75,
           "IMA: t_s as a fraction of num-server-rounds (t_s = floor(f*T)).",
           check=_unit, rule="in [0, 1]"),
    Option("ima.start-round", int, -1,
           "IMA: t_s as a 0-indexed round (>= 0 overrides ima.start-fraction).",
           check=lambda x: x >= -1, rule=">= -1"),
    Option("ima.lr-decay", float, 0.97,
           "IMA: extra per-round client lr decay from t_s on (1 = none).",
           check=lambda x: 0.0 < x <= 1.0, rule="in (0, 1]"),
    Option("ima.average", bool, True,
           "IMA: average the window; false keeps only the lr schedule (the 'same decay, "
           "no averaging' control)."),
    Option("ima.code-start-rule", bool, False,
           "IMA: also wait until t >= P before averaging (the authors' code) instead of "
           "averaging the min(P, t+1) models there are."),
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
    keep_checkpoint: int
    branch_from: str
    save_models: str
    save_models_from: int
    estimators: bool
    estimators_subset: int
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
    lr_decay: float
    momentum: float
    weight_decay: float
    fedprox__mu: float
    fedcda__memory: int
    fedcda__batches: int
    fedcda__warmup: int
    fedcda__warmup_mode: str
    fedcda__smoothness: float
    fedcda__selection: str
    fedcda__cache: str
    fedcross__alpha: float
    fedcross__selection: str
    fedcross__similarity: str
    fedcross__warmup: int
    fedcross__propeller_rounds: int
    fedcross__propellers: int
    fedcross__propeller_beta: float
    fedcross__dynamic_alpha_rounds: int
    fedopt__lr: float
    fedopt__tau: float
    fedopt__beta1: float
    fedopt__beta2: float
    fedopt__bias_correction: bool
    ima__base: str
    ima__window: int
    ima__start_fraction: float
    ima__start_round: int
    ima__lr_decay: float
    ima__average: bool
    ima__code_start_rule: bool
    fraction_evaluate: float
    eval_batch_size: int
    device: str
    client_num_cpus: float
    client_num_gpus: float
    torch_threads: int

    @property
    def strategies(self) -> list[str]:
        """Labels of the strategies of this run, in order."""
        return [v.label for v in parse_strategy(self.strategy)]

    def variants(self) -> list[tuple[str, RunConfig]]:
        """``(label, config)`` per strategy entry, the config holding that one strategy
        with its overrides applied."""
        return [
            (v.label, self.replace(strategy=v.name, **dict(v.overrides)))
            for v in parse_strategy(self.strategy)
        ]

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
    if key == "strategy":
        return ",".join(v.spec for v in parse_strategy(str(out)))
    if opt.choices is not None and str(out) not in opt.choices:
        raise ConfigError(
            f"config key '{key}' got {out!r}; allowed values: {', '.join(opt.choices)}"
        )
    if opt.check is not None and not opt.check(out):
        raise ConfigError(f"config key '{key}' must be {opt.rule}, got {out!r}")
    return out


# Keys a strategy variant may not change: every strategy of a run sees the same data,
# partitions, model, seed and rounds.
SHARED_KEYS = frozenset({
    "name", "output-dir", "strategy", "seed", "num-server-rounds", "clients-per-round",
    "resume", "dataset", "data-dir", "num-clients", "partition", "dirichlet-alpha",
    "dirichlet-min-size", "shards-per-client", "test-subset", "model", "model-norm",
    "device", "client-num-cpus", "client-num-gpus", "torch-threads",
})


@dataclass(frozen=True)
class Variant:
    """One entry of ``strategy``: a strategy name plus config overrides.

    Written ``name`` or ``name[key=value;key=value]``, e.g.
    ``fedcda[fedcda.selection=newest]``.  Its :attr:`label` names its results
    directory and its row in the comparison table.
    """

    name: str
    overrides: tuple[tuple[str, Scalar], ...] = ()

    @property
    def spec(self) -> str:
        """Canonical written form."""
        if not self.overrides:
            return self.name
        return f"{self.name}[{';'.join(f'{k}={v}' for k, v in self.overrides)}]"

    @property
    def label(self) -> str:
        """Directory-safe label, e.g. ``fedcda-selection-newest``."""
        parts = [self.name] + [f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in self.overrides]
        return "-".join(parts).lower()


def _split_entries(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"config key 'strategy': unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise ConfigError(f"config key 'strategy': unbalanced '[' in {text!r}")
    out.append(cur)
    return [e.strip() for e in out if e.strip()]


def parse_strategy(text: str) -> list[Variant]:
    """Parse the ``strategy`` value into :class:`Variant` entries (validated)."""
    variants: list[Variant] = []
    for entry in _split_entries(text):
        name, _, rest = entry.partition("[")
        name = name.strip()
        if name not in STRATEGIES:
            raise ConfigError(
                f"config key 'strategy' got {name!r}; allowed values: {', '.join(STRATEGIES)}"
            )
        overrides: list[tuple[str, Scalar]] = []
        if rest:
            if not rest.endswith("]"):
                raise ConfigError(f"config key 'strategy': entry {entry!r} must end with ']'")
            for item in rest[:-1].split(";"):
                if not item.strip():
                    continue
                if "=" not in item:
                    raise ConfigError(
                        f"config key 'strategy': override {item.strip()!r} in {entry!r} is not "
                        "key=value"
                    )
                k, v = (t.strip() for t in item.split("=", 1))
                if k in SHARED_KEYS:
                    raise ConfigError(
                        f"config key 'strategy': {entry!r} may not change '{k}' (every "
                        "strategy of a run shares data, model, seed and rounds)"
                    )
                overrides.append((k, coerce(k, yaml.safe_load(v) if v else "")))
        variants.append(Variant(name, tuple(overrides)))
    if not variants:
        raise ConfigError("config key 'strategy' is empty")
    labels = [v.label for v in variants]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"config key 'strategy' lists {dup[0]!r} twice")
    return variants


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


def to_toml() -> str:
    """The defaults as the ``[tool.flwr.app.config]`` tables of ``pyproject.toml``."""

    def lit(v: Scalar) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        return repr(v)

    flat = [o for o in OPTIONS if "." not in o.key]
    lines = ["[tool.flwr.app.config]"] + [f"{o.key} = {lit(o.default)}" for o in flat]
    groups: dict[str, list[Option]] = {}
    for o in OPTIONS:
        if "." in o.key:
            groups.setdefault(o.key.split(".", 1)[0], []).append(o)
    for g, opts in groups.items():
        lines += ["", f"[tool.flwr.app.config.{g}]"]
        lines += [f"{o.key.split('.', 1)[1]} = {lit(o.default)}" for o in opts]
    return "\n".join(lines) + "\n"


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
