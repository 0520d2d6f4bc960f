"""The fedsys run configuration: one typed, frozen object parsed once.

Layers, later ones win:

1. the declared defaults: the run's core keys below (:class:`CoreOptions`) and every
   registered method's own options (declared in its module, :mod:`fedsys.options`);
   ``pyproject.toml``'s ``[tool.flwr.app.config]`` table is generated from them
   (``fedsys keys --toml``; a unit test keeps the two identical);
2. Flower's ``context.run_config`` (``flwr run --run-config``);
3. a YAML experiment file (``configs/*.yaml``), flat or nested keys;
4. ``--set key=value`` overrides on the ``fedsys`` command line.

Keys are Flower-style kebab case; nested YAML tables become dotted keys
(``fedprox: {mu: 0.1}`` is ``fedprox.mu``).  An unknown key or a bad value raises
:class:`ConfigError` naming the key and what is allowed.

Which method keys exist is a :class:`Schema`, assembled above this module from the
strategy and trainer registries (``fedsys_launch.config_schema``); this module imports neither,
nor torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedsys.options import (
    REGISTERED_STRATEGIES,
    ConfigError,
    Option,
    Scalar,
    coerce_value,
    declared,
    option,
    suggest,
)

#: a seed is a 32-bit unsigned integer, the range numpy's and most tools' seeds take (a
#: negative one would fail deep in numpy, one past 2**63 in Flower's config records)
MAX_SEED = 2**32 - 1
SEED_BOUNDS = f"[0, {MAX_SEED}]"

DATASETS = ("fashion-mnist", "cifar10", "cifar100", "synthetic", "custom")
MODELS = ("fmnist-cnn", "cifar-cnn", "resnet18", "mlp", "blitz-cnn")


@dataclass(frozen=True)
class CoreOptions:
    """The run's own keys (data, model, schedule, local training, resources).

    ``strategy`` and ``trainer`` take the registered names (checked by the
    :class:`Schema`); every method's keys are declared in the method's module.
    """

    name: str = option(
        'default', 'Run name, one directory name (no /); results go to <output-dir>/<name>/.')
    about: str = option(
        '', "What the run is for: written under the title of its results.md (never changes "
        "the numbers).")
    plugins: str = option(
        '', 'Modules imported before the run, comma-separated: each registers its own '
        'strategies and trainers (one line each) without editing fedsys.  In a deployment only '
        'modules the operator allows in FEDSYS_PLUGINS.')
    output_dir: str = option(
        'runs', 'Directory holding run directories (made absolute).  In a deployment it must '
        "lie under the operator's FEDSYS_ROOTS.")
    strategy: str = option(
        'fedavg,fedprox', 'Strategy, or a comma-separated list run one after another on identical partitions and seeds.')
    seed: int = option(
        0, 'The one seed: partitions, sampling, init and training.', bounds=SEED_BOUNDS)
    seeds: str = option(
        '', 'Seeds to run everything with, comma-separated (YAML list or 0,1,2): one run per '
        'seed under <output-dir>/<name>/seed-<k>/, each with its own partition, sampling, '
        'initial model and training; tables and curves give the mean and std across seeds. '
        'Empty: the one seed.')
    num_server_rounds: int = option(
        30, 'Federated rounds.', bounds='> 0')
    clients_per_round: int = option(
        5, 'Nodes sampled per round.', bounds='> 0')
    min_available_clients: int = option(
        1, 'Fewest connected nodes a round may start with once node-wait-timeout has passed (a round first waits for clients-per-round nodes).', bounds='> 0')
    node_wait_timeout: float = option(
        120.0, 'Seconds to wait for enough nodes before giving up.', bounds='> 0')
    round_timeout: float = option(
        600.0, 'Seconds to wait for the replies of one round.', bounds='> 0')
    transport_retries: int = option(
        1, "Times a round asks a node again whose train reply was lost on the way (Flower's "
        "error codes 3-5: message or reply unavailable, node unavailable; a busy "
        "SuperLink's database shows this), with the same instruction.", bounds='>= 0')
    query_partitions: bool = option(
        True, "Ask every node for its partition-id before sampling (fedsys's ClientApp "
        "answers; a seed then picks the same clients every run); false for a ClientApp "
        "written from Flower's docs, which has no query handler: nodes are keyed by the "
        "partition-id their first reply reports, else by node id.")
    resume: bool = option(
        False, "Continue from the run directory's checkpoint.")
    checkpoint_every: int = option(
        1, 'Write a checkpoint every k rounds.', bounds='> 0')
    keep_checkpoint: int = option(
        0, "Also keep the checkpoint of this round as <strategy>/checkpoint-rNNNN.pt, a branch point for 'branch-from' (0: none).", bounds='>= 0')
    branch_from: str = option(
        '', "Start from a kept checkpoint (<run>/<strategy>/checkpoint-rNNNN.pt) of a run that is identical up to that round, instead of from round 0: the earlier rounds' metrics are copied, the rest is trained.  Only keys that have not acted yet may differ (ima.average and ima.lr-decay before IMA starts).  In a deployment it must lie under the operator's FEDSYS_ROOTS.")
    save_models: str = option(
        'none', "Keep models for 'fedsys landscape': 'global' (each round's global model) or 'all' (also every accepted client model) under <strategy>/models/.", choices=('none', 'global', 'all'))
    save_models_from: int = option(
        1, 'First round whose models save-models keeps.', bounds='> 0')
    estimators: bool = option(
        False, "Log per-round landscape estimators (IMA spec 3.4): largest and mean client-to-global distance, and the client models' loss on training data they do not hold.")
    estimators_subset: int = option(
        2000, "Samples of other clients' training data per client for the held-out loss.", bounds='> 0')
    dataset: str = option(
        'fashion-mnist', "Dataset.  'custom': one of your own in data-dir (train.npz and "
        "test.npz with arrays x, uint8 images, and y, labels 0..K-1; or train/ and test/ with a "
        "folder of images per class), partitioned like the others.", choices=DATASETS)
    data_dir: str = option(
        '', 'Data root searched first (empty: $FEDSYS_DATA, system).  In a deployment it must '
        "lie under the operator's FEDSYS_ROOTS or $FEDSYS_DATA; a site's node-config "
        'data-dir replaces it there.')
    num_clients: int = option(
        20, 'Partitions (simulated clients).', bounds='> 0')
    partition: str = option(
        'dirichlet', 'Partitioner; dirichlet-balanced: Lin et al. 2020\'s split (FedCDA\'s '
        'paper), client sizes held near the average; dirichlet-capped: FedCross\'s and IMA\'s '
        'code (FedLab), a client at the average size gets no more; domain: an IID split, '
        'each client seeing its share through its own seeded input transform (rotation, '
        'inversion, blur, contrast), a domain-shift stand-in for PACS.',
        choices=('iid', 'dirichlet', 'dirichlet-balanced', 'dirichlet-capped', 'shards',
                 'domain'))
    dirichlet_alpha: float = option(
        0.3, 'Dirichlet concentration (dirichlet, dirichlet-balanced, dirichlet-capped).',
        bounds='> 0')
    dirichlet_min_size: int = option(
        10, 'Smallest client under dirichlet and dirichlet-capped (dirichlet-balanced: half '
        'the average, as Lin et al.).', bounds='>= 0')
    shards_per_client: int = option(
        2, 'Label shards per client.', bounds='> 0')
    samples_per_client: int = option(
        0, 'Keep at most this many training samples per client, drawn uniformly at random '
        '(seeded) from its partition after the split, so its label mix stays as drawn '
        '(0 = all; LSS spec 5.1 uses 1-2k).', bounds='>= 0')
    test_subset: int = option(
        0, 'Evaluate on the first n test samples (0 = all).', bounds='>= 0')
    model: str = option(
        'fmnist-cnn', 'Model from the registry.', choices=MODELS)
    model_norm: str = option(
        'bn', 'ResNet-18 normalisation.', choices=('bn', 'gn'))
    init_from: str = option(
        '', 'Start from a saved model: a `fedsys pretrain` file or a plain state dict (a '
        'torchvision .pth); empty: the seeded random model.  In a deployment it must lie under '
        "the operator's FEDSYS_ROOTS or $FEDSYS_DATA.")
    init_reinit: str = option(
        '', 'With init-from: entries kept freshly initialised, comma-separated name prefixes '
        '(fc for a new head, conv1 for a small-image stem).')
    trainer: str = option(
        'auto', "Local trainer; 'auto' takes the strategy's own.")
    local_epochs: int = option(
        1, 'Local epochs per round.', bounds='> 0')
    local_steps: int = option(
        0, 'Cap on local SGD steps per round (0 = no cap).', bounds='>= 0')
    batch_size: int = option(
        32, 'Local batch size.', bounds='> 0')
    lr: float = option(
        0.05, 'Client learning rate.', bounds='> 0')
    lr_decay: float = option(
        1.0, 'Per-round client lr decay gamma: lr_t = lr * gamma^t (t = round - 1; 1 = none).', bounds='(0, 1]')
    optimizer: str = option(
        'sgd', 'Optimiser of the sgd and fedprox trainers (adam: Adam with coupled weight '
        'decay, as LSS and FedELMY, whose trainers always use Adam).', choices=('sgd', 'adam'))
    momentum: float = option(
        0.0, 'Client SGD momentum.', bounds='[0, 1]')
    trainable: str = option(
        'all', 'Parameters local training updates, for every trainer: all, or head (the '
        'classifier layer only, the rest frozen, as the LSS official code ran every method).',
        choices=('all', 'head'))
    weight_decay: float = option(
        0.0, 'Client L2 weight decay.', bounds='>= 0')
    max_examples_ratio: float = option(
        100.0, 'A train reply claiming more num-examples than its node declared for its '
        'partition is refused; one from a node that declared none, when it claims more than '
        'this many times the median of the round\'s other claims (0: no such bound).',
        bounds='>= 0')
    max_update_ratio: float = option(
        20.0, 'A train reply whose update (its model minus the model it was sent) has an L2 '
        'norm above this many times the median of the round\'s other updates (three replies '
        'or more), else of the updates accepted before (a chain\'s earlier hops), is refused '
        'with the numbers (0: no such bound).', bounds='>= 0')
    max_weight_ratio: float = option(
        15.0, 'A train reply claiming more num-examples than this many times the median of '
        'the round\'s other claims is counted as that many times the median, and logged (from '
        'two replies on; 0: no such bound).  15: a site with 10 times the data of the others '
        'keeps its weight, as under Flower\'s FedAvg; attack.count-factor 20 is cut.',
        bounds='>= 0')
    max_weight_share: float = option(
        0.0, 'No reply\'s claimed num-examples may give it more than this share of an '
        'example-weighted mean, from two replies on: the largest claims are cut to one level '
        'at which each has this share after every cut, and logged (below 1/n for n replies: '
        'equal weights; 0 or 1: no cap, the default: it binds on an honest site that holds '
        'more data than the others together; 0.5 before issue 77).', bounds='[0, 1]')
    fraction_evaluate: float = option(
        0.0, 'Fraction of nodes asked for federated evaluation each round.', bounds='[0, 1]')
    eval_batch_size: int = option(
        256, 'Batch size of evaluation.', bounds='> 0')
    device: str = option(
        'auto', 'Torch device for clients and server.', choices=('auto', 'cpu', 'cuda'))
    engine: str = option(
        'flower', "How 'fedsys run' simulates: 'flower' runs the ClientApps in Flower's "
        'simulation engine (Ray actors behind an in-process SuperLink; clients train in '
        'parallel, as client-num-cpus and client-num-gpus allow); \'inprocess\' calls each '
        "ClientApp in this process through fedsys's own Grid (no Ray, no SuperLink: far less "
        'cost per message, for many small clients; a round\'s clients trained together as '
        'batch-clients says; every message is answered when it is sent, so round-timeout '
        "refuses no reply, and the clients use this process's devices).  flwr run and a "
        'deployment ignore it.',
        choices=('flower', 'inprocess'))
    batch_clients: str = option(
        'auto', "With engine 'inprocess': train a round's clients together, their models "
        'stacked into one batched computation (clients/batched.py; the same numbers to float '
        'rounding, not to the bit), where their trainers (sgd, fedprox) and local settings '
        "agree and the model has no batch norm or dropout.  'auto': where that is faster, "
        'on a GPU always, on the CPU for models without convolutions (a convolution of '
        'stacked models runs grouped, slower on the CPU than one client after another: '
        "docs/performance.md); 'true': wherever possible; 'false': one client at a time, "
        "bit-identical to engine 'flower'.  Other trainers always train one at a time.",
        choices=('auto', 'true', 'false'))
    tracking: str = option(
        'none', "Also log each round's record to TensorBoard ('tensorboard': "
        "<run>/tensorboard/<strategy>/, open with 'tensorboard --logdir runs/NAME'), MLflow "
        "('mlflow': its local store <output-dir>/mlflow.db, open with 'mlflow ui "
        "--backend-store-uri sqlite:///runs/mlflow.db'), Weights & Biases offline ('wandb': "
        "<output-dir>/wandb/, browse with 'wandb leet runs/wandb', upload with 'wandb sync'), "
        "'both' (TensorBoard and MLflow) or 'all' three: the config as parameters, every "
        "number at step = round, results.md, the figures and the final model; a resumed run "
        "continues the same tracker run (pip install 'fedsys[tracking]', 'fedsys[wandb]').",
        choices=('none', 'tensorboard', 'mlflow', 'wandb', 'both', 'all'))
    ray_address: str = option(
        '', "An existing Ray cluster to run on ('ray start --head' on one machine, 'ray start "
        "--address=HEAD:PORT' on the others; give the head's host:port, or 'auto'). With "
        "engine 'flower' the simulation joins it (as the environment variable RAY_ADDRESS "
        "does; this key wins). With engine 'inprocess' the clients trained together are "
        'spread over Ray workers there, one per GPU of the cluster (device cuda or auto), '
        'or one per node using its CPUs (device cpu); fedsys and torch must be installed '
        "on every node.  Empty: no cluster (the 'inprocess' engine uses this process's "
        "devices, 'flower' starts a private one unless RAY_ADDRESS is set).")
    client_num_cpus: float = option(
        1.0, 'CPUs per simulated client.', bounds='> 0')
    client_num_gpus: float = option(
        0.0, 'GPUs per simulated client (fractions share a GPU).', bounds='>= 0')
    torch_threads: int = option(
        1, 'torch intra-op threads per client (0 = torch default).', bounds='>= 0')


@dataclass(frozen=True)
class Schema:
    """Every known key: the core keys plus each registered method's declared options.

    Built by :meth:`assemble` from the registries (``fedsys_launch.config_schema.SCHEMA``).
    """

    strategies: tuple[str, ...]
    trainers: tuple[str, ...]
    groups: tuple[tuple[str, type], ...] = ()
    options: tuple[Option, ...] = ()

    @classmethod
    def assemble(cls, strategies: Sequence[str], trainers: Sequence[str],
                 groups: Iterable[tuple[str, type]]) -> Schema:
        """Collect the core keys and each ``(prefix, options class)`` group.

        A group may be named by several methods (FedAdam and FedYogi share
        ``fedopt``) as long as it is the same class; two declarations of one key
        are an error.
        """
        seen: dict[str, type] = {}
        for prefix, options_cls in groups:
            if seen.get(prefix, options_cls) is not options_cls:
                raise ValueError(f"option prefix {prefix!r} is declared by both "
                                 f"{seen[prefix].__name__} and {options_cls.__name__}")
            seen[prefix] = options_cls
        rows: list[Option] = []
        for o in declared("", CoreOptions):
            if o.key == "strategy":
                o = dataclasses.replace(o, choices=None)
            elif o.key == "trainer":
                o = dataclasses.replace(o, choices=("auto", *trainers))
            rows.append(o)
        for prefix, options_cls in seen.items():
            for o in declared(prefix, options_cls):
                if o.choices == REGISTERED_STRATEGIES:
                    o = dataclasses.replace(
                        o, choices=tuple(s for s in strategies if s != prefix))
                rows.append(o)
        keys = [o.key for o in rows]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ValueError(f"config key(s) {dup} declared twice")
        return cls(tuple(strategies), tuple(trainers), tuple(seen.items()), tuple(rows))

    @property
    def by_key(self) -> dict[str, Option]:
        """``{key: Option}``."""
        return {o.key: o for o in self.options}

    @property
    def defaults(self) -> dict[str, Scalar]:
        """``{key: default}`` in declaration order."""
        return {o.key: o.default for o in self.options}

    def method_keys(self) -> list[str]:
        """The keys that are not core keys (dotted, declared by methods)."""
        return [o.key for o in self.options if "." in o.key]


#: The core keys alone (no strategy or trainer registered): for code that needs
#: no method keys.  Real runs use ``fedsys_launch.config_schema.SCHEMA``.
CORE_SCHEMA = Schema.assemble((), (), ())


#: Python names of the core keys.
CORE_FIELDS = frozenset(f.name for f in dataclasses.fields(CoreOptions))


@dataclass(frozen=True)
class RunConfig(CoreOptions):
    """Resolved configuration of one run.

    Core keys are attributes in snake case (``num-clients`` is ``num_clients``);
    method keys are read with :meth:`get` (``cfg.get("fedcda.warmup")``) or as a
    group with :meth:`group`.
    """

    methods: tuple[tuple[str, Scalar], ...] = ()
    schema: Schema = field(default=CORE_SCHEMA, compare=False, repr=False)

    @property
    def strategies(self) -> list[str]:
        """Labels of the strategies of this run, in order."""
        return [v.label for v in parse_strategy(self.strategy, self.schema)]

    def variants(self) -> list[tuple[str, RunConfig]]:
        """``(label, config)`` per strategy entry, the config holding that one strategy
        with its overrides applied."""
        return [
            (v.label, self.replace(strategy=v.name, **dict(v.overrides)))
            for v in parse_strategy(self.strategy, self.schema)
        ]

    @property
    def run_dir(self) -> Path:
        """Absolute run directory ``<output-dir>/<name>``."""
        return Path(self.output_dir).expanduser().resolve() / self.name

    @functools.cached_property
    def _method_values(self) -> dict[str, Scalar]:
        """:attr:`methods` as a dict, made once (a node reads a few keys for every
        instruction; the dataclass's equality and hash leave it out)."""
        return dict(self.methods)

    def get(self, key: str) -> Scalar:
        """The value of any key (core or method)."""
        if "." not in key and key.replace("-", "_") in CORE_FIELDS:
            return getattr(self, key.replace("-", "_"))
        values = self._method_values
        if key not in values:
            raise ConfigError(f"unknown config key '{key}'.{suggest(key, self.to_dict())}")
        return values[key]

    @functools.cached_property
    def _groups(self) -> dict[str, dict[str, Scalar]]:
        """:meth:`group`'s answers by prefix, each found once (a node asks for its
        trainer's group at every instruction)."""
        return {}

    def group(self, prefix: str) -> dict[str, Scalar]:
        """The values of one method's keys, by full key (``{"fedcda.warmup": 50, ...}``):
        a new dict at each call."""
        kept = self._groups.get(prefix)
        if kept is None:
            kept = self._groups[prefix] = {k: v for k, v in self.methods
                                           if k.startswith(prefix + ".")}
        return dict(kept)

    def fields_of(self, prefix: str) -> dict[str, Scalar]:
        """One method's values by option field name (``{"warmup_mode": "fedavg", ...}``),
        the keyword arguments of its options dataclass."""
        return {k.split(".", 1)[1].replace("-", "_"): v for k, v in self.group(prefix).items()}

    def to_dict(self) -> dict[str, Scalar]:
        """Return the flat kebab-case mapping (the Flower run-config form)."""
        core = {o.key: getattr(self, o.field) for o in declared("", CoreOptions)}
        return {**core, **dict(self.methods)}

    def replace(self, **changes: Scalar) -> RunConfig:
        """Return a validated copy with kebab-case keys changed."""
        return build({**self.to_dict(), **changes}, schema=self.schema)

    def save(self, path: Path) -> None:
        """Write the resolved config as YAML, headed by a checksum of the rest (a run
        directory's config is checked by :func:`verify_saved` before a resume)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        body = yaml.safe_dump(self.to_dict(), sort_keys=False)
        digest = hashlib.sha256(body.encode()).hexdigest()
        path.write_text(f"{SAVED_HEAD} sha256:{digest}\n{body}")


def coerce(key: str, value: Any, schema: Schema) -> Scalar:
    """Convert and validate one value for ``key``; raise :class:`ConfigError`."""
    opt = schema.by_key.get(key)
    if opt is None:
        raise ConfigError(f"unknown config key '{key}'.{suggest(key, schema.by_key)}")
    if key in ("strategy", "seeds") and isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    out = coerce_value(opt, value)
    if key == "strategy":
        return ",".join(v.spec for v in parse_strategy(str(out), schema))
    if key == "seeds":
        return ",".join(str(k) for k in parse_seeds(str(out)))
    if key == "name":
        check_name(str(out))
    return out


def check_name(name: str) -> None:
    """Refuse a run ``name`` that is not one directory name: empty, ``.``, ``..`` or with a
    path separator would put the run outside ``<output-dir>/`` (``output-dir`` says where)."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"config key 'name' must be one directory name (no '/', not '.' or "
                          f"'..'), got {name!r}; set output-dir for where runs go")


def parse_seeds(text: str) -> list[int]:
    """``"0, 1,2"`` -> ``[0, 1, 2]`` (distinct integers in ``[0, MAX_SEED]``, order kept);
    empty: ``[]``."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        out = [int(t) for t in items]
    except ValueError:
        raise ConfigError(f"config key 'seeds' got {text!r}; give integers, e.g. 0,1,2") from None
    if any(not 0 <= k <= MAX_SEED for k in out) or len(set(out)) != len(out):
        raise ConfigError(f"config key 'seeds' got {text!r}; give distinct integers "
                          f"in {SEED_BOUNDS}")
    return out


# Keys a strategy variant may not change: every strategy of a run sees the same data,
# partitions, model, seed and rounds.
SHARED_KEYS = frozenset({
    "name", "plugins", "output-dir", "strategy", "seed", "seeds", "num-server-rounds",
    "clients-per-round",
    "resume", "dataset", "data-dir", "num-clients", "partition", "dirichlet-alpha",
    "dirichlet-min-size", "shards-per-client", "samples-per-client", "test-subset", "model", "model-norm",
    "device", "engine", "batch-clients", "ray-address", "tracking", "client-num-cpus", "client-num-gpus", "torch-threads",
    "pretrain.holdout", "pretrain.split", "pretrain.labels",
})
#: Groups whose every key is shared like SHARED_KEYS: a robustness experiment's attackers
#: (``attack.*``, fedsys.attacks), which the ClientApp reads from the run's config.
SHARED_GROUPS = ("attack.",)


def is_shared(key: str) -> bool:
    """Whether every strategy of a run must share ``key`` (a variant may not change it)."""
    return key in SHARED_KEYS or key.startswith(SHARED_GROUPS)


@dataclass(frozen=True)
class Variant:
    """One entry of ``strategy``: a strategy name plus config overrides.

    Written ``name`` or ``name[key=value;key=value]``, e.g.
    ``fedcda[fedcda.selection=newest]``, optionally followed by ``as LABEL``
    (``fedavg[trainer=lss] as fedavg+lss``).  Its :attr:`label` names its results
    directory and its row in the comparison table.
    """

    name: str
    overrides: tuple[tuple[str, Scalar], ...] = ()
    alias: str = ""

    @property
    def spec(self) -> str:
        """Canonical written form."""
        base = (self.name if not self.overrides else
                f"{self.name}[{';'.join(f'{k}={v}' for k, v in self.overrides)}]")
        return f"{base} as {self.alias}" if self.alias else base

    @property
    def label(self) -> str:
        """Directory-safe label: the ``as`` name, else e.g. ``fedcda-selection-newest``."""
        if self.alias:
            return self.alias
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


def parse_strategy(text: str, schema: Schema) -> list[Variant]:
    """Parse the ``strategy`` value into :class:`Variant` entries (validated)."""
    variants: list[Variant] = []
    for entry in _split_entries(text):
        entry, _, alias = entry.partition(" as ")
        alias = alias.strip()
        if alias and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", alias):
            raise ConfigError(f"config key 'strategy': label {alias!r} must be letters, digits "
                              "and _ . + - (it names a directory)")
        entry = entry.strip()
        name, _, rest = entry.partition("[")
        name = name.strip()
        if name not in schema.strategies:
            raise ConfigError(
                f"config key 'strategy' got {name!r}; allowed values: {', '.join(schema.strategies)}"
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
                if is_shared(k):
                    raise ConfigError(
                        f"config key 'strategy': {entry!r} may not change '{k}' (every "
                        "strategy of a run shares data, model, seed, rounds and attackers)"
                    )
                if any(k == done for done, _ in overrides):
                    raise ConfigError(f"config key 'strategy': {entry!r} sets '{k}' twice")
                overrides.append((k, coerce(k, yaml.safe_load(v) if v else "", schema)))
        variants.append(Variant(name, tuple(overrides), alias))
    if not variants:
        raise ConfigError("config key 'strategy' is empty")
    labels = [v.label for v in variants]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"config key 'strategy' lists {dup[0]!r} twice")
    return variants


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys (``{a: {b: 1}}`` -> ``{'a.b': 1}``); a key
    given both ways (``fedcda: {warmup: 3}`` and ``fedcda.warmup: 4``) is refused."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        for sub, value in (flatten(v, key + ".") if isinstance(v, Mapping) else {key: v}).items():
            if sub in out:
                raise ConfigError(f"config key '{sub}' is given twice ({out[sub]!r} and "
                                  f"{value!r}); keep one")
            out[sub] = value
    return out


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the
    last one without a word: a second ``fedcda:`` block would drop the first)."""


def _unique_mapping(loader: _UniqueKeys, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (lines {seen[key]} and {line}); "
                    "keep one", key_node.start_mark)
            seen[key] = line
        except TypeError:  # an unhashable key: construct_mapping says what is wrong
            break
    return loader.construct_mapping(node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


SAVED_HEAD = "# fedsys run config,"


def verify_saved(path: Path) -> None:
    """Check a run directory's ``config.yaml`` against its checksum line.

    Raises :class:`ConfigError` when the file is missing, or when its content does not
    match the checksum (truncated or edited); a file without the line (written before
    fedsys had it) passes.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: not a fedsys run directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__})") from None
    head, _, body = text.partition("\n")
    if not head.startswith(SAVED_HEAD):
        return
    want = head.rsplit("sha256:", 1)[-1].strip()
    if hashlib.sha256(body.encode()).hexdigest() != want:
        raise ConfigError(f"{path} is truncated or was edited (its checksum does not match); "
                          "change a resumed run with --set, not by editing its config.yaml")


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML experiment file into flat dotted keys."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=_UniqueKeys) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not text
        raise ConfigError(f"config file {path} cannot be read ({type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return flatten(data)


def build(*layers: Mapping[str, Any], schema: Schema) -> RunConfig:
    """Merge ``layers`` over the schema's defaults, validate, return a frozen config."""
    merged: dict[str, Scalar] = schema.defaults
    for layer in layers:
        for k, v in flatten(layer).items():
            merged[k] = coerce(k, v, schema)
    if merged["clients-per-round"] > merged["num-clients"]:  # type: ignore[operator]
        raise ConfigError(
            f"config key 'clients-per-round' ({merged['clients-per-round']}) must be "
            f"<= num-clients ({merged['num-clients']})"
        )
    if int(merged.get("attack.clients", 0)) > int(merged["num-clients"]):
        raise ConfigError(
            f"config key 'attack.clients' ({merged['attack.clients']}) must be "
            f"<= num-clients ({merged['num-clients']})"
        )
    if schema.strategies:  # the default must name registered strategies too
        parse_strategy(str(merged["strategy"]), schema)
    core = {o.field: merged[o.key] for o in declared("", CoreOptions)}
    methods = tuple((k, merged[k]) for k in schema.method_keys())
    return RunConfig(**core, methods=methods, schema=schema)  # type: ignore[arg-type]


def toml_text(data: Mapping[str, Any]) -> str:
    """``data`` as TOML text: fedsys's one TOML writer (``tomli_w``, which Flower itself
    depends on, quotes and escapes every key and string)."""
    import tomli_w

    return tomli_w.dumps(data)


def to_toml(schema: Schema) -> str:
    """The defaults as the ``[tool.flwr.app.config]`` tables of ``pyproject.toml``."""
    table: dict[str, Any] = {o.key: o.default for o in schema.options if "." not in o.key}
    for o in schema.options:
        if "." in o.key:
            group, key = o.key.split(".", 1)
            table.setdefault(group, {})[key] = o.default
    return toml_text({"tool": {"flwr": {"app": {"config": table}}}})


def key_rows(schema: Schema) -> list[tuple[str, str, str, str]]:
    """Every key as (key, default, what it allows, meaning): what :func:`describe` and
    :func:`describe_markdown` print."""
    rows = []
    for o in schema.options:
        if o.key == "strategy":
            allowed = ", ".join(schema.strategies)
        else:
            allowed = ", ".join(o.choices) if o.choices else (o.rule or o.type.__name__)
        rows.append((o.key, str(o.default), allowed, o.help))
    return rows


def describe(schema: Schema) -> str:
    """Return a table of every key, its default and what it allows."""
    return "\n".join(f"  {k:24} {d:12} {a:28} {h}" for k, d, a, h in key_rows(schema))


def describe_markdown(schema: Schema) -> str:
    """:func:`describe`'s table in Markdown (``fedsys keys --markdown``, which writes
    ``docs/configuration.md``'s table)."""
    def cell(text: str) -> str:
        return (text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")
                .replace(">", "&gt;"))

    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {('`' + cell(d) + '`') if d else ''} | {cell(a)} | {cell(h)} |"
              for k, d, a, h in key_rows(schema)]
    return "\n".join(lines)


__all__ = ["CORE_SCHEMA", "DATASETS", "MODELS", "SHARED_KEYS", "ConfigError", "CoreOptions",
           "Option", "RunConfig", "Scalar", "Schema", "Variant", "build", "coerce", "describe",
           "describe_markdown", "flatten", "is_shared", "key_rows", "load_yaml", "parse_overrides",
           "parse_seeds", "parse_strategy", "to_toml", "toml_text", "verify_saved"]
