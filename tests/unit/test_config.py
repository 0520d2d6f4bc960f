"""The config: defaults and pyproject sync, declared options, validation that names the
key, layering, variants, presets."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fedsys import config as core
from fedsys.config import ConfigError, RunConfig
from fedsys_launch import config_schema

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


SCHEMA = config_schema.schema()  # the registered methods' schema, as every config is built with
DEFAULTS = SCHEMA.defaults


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------------ defaults


def test_build_without_layers_equals_defaults():
    cfg = config_schema.build()
    assert isinstance(cfg, RunConfig)
    assert cfg.to_dict() == DEFAULTS
    for key, value in DEFAULTS.items():
        got = cfg.to_dict()[key]
        assert type(got) is type(value), key


def test_defaults_cover_every_option_with_right_type():
    assert list(DEFAULTS) == [o.key for o in SCHEMA.options]
    for o in SCHEMA.options:
        assert type(o.default) is o.type, o.key
        # every default passes its own validation
        assert config_schema.coerce(o.key, o.default) == o.default


def test_pyproject_run_config_equals_defaults():
    data = tomllib.loads(PYPROJECT.read_text())
    table = _flatten(data["tool"]["flwr"]["app"]["config"])
    fix = "; run python scripts/sync_pyproject_config.py"
    assert set(table) == set(DEFAULTS), (
        f"only in pyproject: {sorted(set(table) - set(DEFAULTS))}; "
        f"only in config.py: {sorted(set(DEFAULTS) - set(table))}{fix}"
    )
    for key, default in DEFAULTS.items():
        assert table[key] == default, key + fix
        assert type(table[key]) is type(default), f"{key}: {type(table[key])} vs {type(default)}"


def test_from_run_config_empty_equals_defaults():
    assert config_schema.from_run_config({}) == config_schema.build()
    assert config_schema.from_run_config({}).to_dict() == DEFAULTS


def test_from_run_config_pyproject_table_equals_defaults():
    data = tomllib.loads(PYPROJECT.read_text())
    # Flower hands the table over flattened with dotted keys
    run_config = _flatten(data["tool"]["flwr"]["app"]["config"])
    assert config_schema.from_run_config(run_config) == config_schema.build()


def test_field_names_snake_case_with_double_underscore():
    cfg = config_schema.build({"fedprox.mu": 0.2, "num-clients": 7, "clients-per-round": 3})
    assert cfg.get("fedprox.mu") == 0.2
    assert cfg.num_clients == 7
    assert cfg.clients_per_round == 3


# -------------------------------------------------------------------- unknown keys


def test_unknown_key_names_key():
    with pytest.raises(ConfigError, match="no-such-key"):
        config_schema.build({"no-such-key": 1})


def test_typo_suggests_close_match():
    with pytest.raises(ConfigError) as exc:
        config_schema.build({"num-clinets": 5})
    msg = str(exc.value)
    assert "num-clinets" in msg
    assert "num-clients" in msg


def test_unknown_nested_key_is_dotted():
    with pytest.raises(ConfigError, match=r"fedprox\.nu"):
        config_schema.build({"fedprox": {"nu": 0.1}})


# ---------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", "abc"),
        ("lr", True),
        ("lr", float("nan")),
        ("lr", float("inf")),
        ("seed", "x"),
        ("seed", 1.5),
        ("seed", True),
        ("num-clients", "3.5"),
        ("resume", "maybe"),
        ("resume", 2),
        ("name", ["a"]),
        ("name", True),
        ("data-dir", None),
    ],
)
def test_wrong_type_rejected_naming_key(key, value):
    with pytest.raises(ConfigError) as exc:
        config_schema.build({key: value})
    assert f"'{key}'" in str(exc.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", -1),
        ("lr", 0),
        ("momentum", 2),
        ("momentum", -0.1),
        ("fraction-evaluate", 1.5),
        ("num-server-rounds", 0),
        ("batch-size", -4),
        ("dirichlet-alpha", 0.0),
        ("dirichlet-min-size", -1),
        ("fedprox.mu", -0.01),
        ("weight-decay", -1e-4),
        ("torch-threads", -1),
    ],
)
def test_out_of_range_rejected_naming_key_and_rule(key, value):
    opt = SCHEMA.by_key[key]
    with pytest.raises(ConfigError) as exc:
        config_schema.build({key: value})
    msg = str(exc.value)
    assert f"'{key}'" in msg
    assert opt.rule in msg


@pytest.mark.parametrize(
    ("key", "value", "bad"),
    [
        ("partition", "dir", "dir"),
        ("strategy", "fedavg,nope", "nope"),
        ("strategy", "FedAvg", "FedAvg"),
        ("model", "resnet50", "resnet50"),
        ("dataset", "mnist", "mnist"),
        ("device", "tpu", "tpu"),
        ("model-norm", "ln", "ln"),
        ("trainer", "adam", "adam"),
    ],
)
def test_bad_choice_lists_allowed_values(key, value, bad):
    with pytest.raises(ConfigError) as exc:
        config_schema.build({key: value})
    msg = str(exc.value)
    assert f"'{key}'" in msg
    assert repr(bad) in msg
    for allowed in SCHEMA.by_key[key].choices or SCHEMA.strategies:
        assert allowed in msg


def test_good_choices_accepted():
    cfg = config_schema.build({"partition": "shards", "strategy": "fedprox", "model": "mlp"})
    assert (cfg.partition, cfg.strategy, cfg.model) == ("shards", "fedprox", "mlp")


def test_numeric_strings_and_ints_coerced():
    cfg = config_schema.build({"lr": "0.1", "seed": "12", "momentum": 1, "num-clients": 10.0})
    assert cfg.lr == 0.1 and type(cfg.lr) is float
    assert cfg.seed == 12 and type(cfg.seed) is int
    assert cfg.momentum == 1.0 and type(cfg.momentum) is float
    assert cfg.num_clients == 10 and type(cfg.num_clients) is int


def test_boundary_values_accepted():
    cfg = config_schema.build({"momentum": 1.0, "fraction-evaluate": 0.0, "fedprox.mu": 0.0})
    assert cfg.momentum == 1.0
    assert cfg.fraction_evaluate == 0.0
    assert cfg.get("fedprox.mu") == 0.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        ("false", False),
        ("True", True),
        ("FALSE", False),
        (True, True),
        (False, False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("off", False),
    ],
)
def test_bool_parsing(value, expected):
    cfg = config_schema.build({"resume": value})
    assert cfg.resume is expected


# ------------------------------------------------------------------------ strategy


def test_strategy_list_becomes_comma_string():
    cfg = config_schema.build({"strategy": ["fedprox", "fedavg"]})
    assert cfg.strategy == "fedprox,fedavg"
    assert cfg.strategies == ["fedprox", "fedavg"]


def test_strategy_yaml_list(tmp_path):
    path = _write(tmp_path / "exp.yaml", "strategy:\n  - fedavg\n  - fedprox\n")
    cfg = config_schema.load(path)
    assert cfg.strategy == "fedavg,fedprox"
    assert cfg.strategies == ["fedavg", "fedprox"]


def test_strategies_strips_spaces():
    cfg = config_schema.build({"strategy": " fedavg , fedprox "})
    assert cfg.strategies == ["fedavg", "fedprox"]


def test_default_strategies():
    assert config_schema.build().strategies == ["fedavg", "fedprox"]


# ------------------------------------------------------------------------- layers


def test_later_layer_wins():
    cfg = config_schema.build({"lr": 0.1, "seed": 3}, {"lr": 0.2})
    assert cfg.lr == 0.2
    assert cfg.seed == 3


def test_load_layering_order(tmp_path):
    path = _write(tmp_path / "exp.yaml", "lr: 0.2\nseed: 5\nbatch-size: 64\n")
    cfg = config_schema.load(
        path,
        overrides=["lr=0.3"],
        run_config={"lr": 0.1, "seed": 1, "num-server-rounds": 7, "batch-size": 16},
    )
    assert cfg.lr == 0.3  # override beats YAML and run_config
    assert cfg.seed == 5  # YAML beats run_config
    assert cfg.batch_size == 64  # YAML beats run_config
    assert cfg.num_server_rounds == 7  # run_config beats defaults
    assert cfg.momentum == DEFAULTS["momentum"]  # untouched default


def test_load_without_yaml(tmp_path):
    cfg = config_schema.load(None, overrides=["seed=9"], run_config={"seed": 1, "lr": 0.5})
    assert cfg.seed == 9
    assert cfg.lr == 0.5


def test_nested_yaml_gives_dotted_key(tmp_path):
    path = _write(tmp_path / "exp.yaml", "fedprox:\n  mu: 0.5\nlr: 0.01\n")
    assert core.load_yaml(path) == {"fedprox.mu": 0.5, "lr": 0.01}
    cfg = config_schema.load(path)
    assert cfg.get("fedprox.mu") == 0.5
    assert cfg.to_dict()["fedprox.mu"] == 0.5


def test_flat_dotted_yaml_key(tmp_path):
    path = _write(tmp_path / "exp.yaml", "fedprox.mu: 0.25\n")
    assert config_schema.load(path).get("fedprox.mu") == 0.25


def test_override_dotted_key():
    cfg = config_schema.load(None, overrides=["fedprox.mu=0.7"])
    assert cfg.get("fedprox.mu") == 0.7


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = _write(tmp_path / "empty.yaml", "")
    assert config_schema.load(path) == config_schema.build()


def test_a_config_file_that_is_not_a_yaml_mapping_is_refused_by_name(tmp_path):
    cases = {"list.yaml": "- 1\n- 2\n", "broken.yaml": "a: [1,\n"}
    for name, text in cases.items():
        with pytest.raises(ConfigError, match=name):
            config_schema.load(_write(tmp_path / name, text))
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"binary\.yaml cannot be read \(UnicodeDecodeError\)"):
        config_schema.load(tmp_path / "binary.yaml")
    with pytest.raises(ConfigError, match="cannot be read"):
        config_schema.load(tmp_path)                                       # a directory


def test_clients_per_round_above_num_clients_rejected():
    with pytest.raises(ConfigError, match="clients-per-round"):
        config_schema.build({"num-clients": 4, "clients-per-round": 5})
    # equal is fine
    cfg = config_schema.build({"num-clients": 5, "clients-per-round": 5})
    assert cfg.clients_per_round == cfg.num_clients == 5


def test_clients_per_round_checked_after_all_layers():
    # an intermediate layer may violate it as long as the final merge does not
    cfg = config_schema.build({"clients-per-round": 30}, {"num-clients": 40})
    assert (cfg.clients_per_round, cfg.num_clients) == (30, 40)


# --------------------------------------------------------------- frozen / roundtrip


def test_run_config_is_frozen():
    cfg = config_schema.build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]


def test_to_dict_build_roundtrip():
    cfg = config_schema.build({"lr": 0.2, "strategy": "fedprox", "fedprox.mu": 0.3})
    d = cfg.to_dict()
    assert list(d) == [o.key for o in SCHEMA.options]
    assert config_schema.build(d) == cfg


def test_replace_returns_changed_copy():
    cfg = config_schema.build()
    new = cfg.replace(**{"lr": 0.5, "num-clients": 8, "fedprox.mu": 0.2})
    assert new.lr == 0.5 and new.num_clients == 8 and new.get("fedprox.mu") == 0.2
    assert cfg.lr == DEFAULTS["lr"]  # original untouched
    assert new.replace(**{"lr": cfg.lr, "num-clients": 20, "fedprox.mu": 0.01}) == cfg


def test_replace_validates():
    with pytest.raises(ConfigError, match="'lr'"):
        config_schema.build().replace(lr=-1)
    with pytest.raises(ConfigError, match="clients-per-round"):
        config_schema.build().replace(**{"num-clients": 2})


def test_save_then_load_reproduces_config(tmp_path):
    cfg = config_schema.build(
        {
            "name": "exp1",
            "lr": 0.125,
            "strategy": "fedprox,fedavg",
            "fedprox.mu": 0.5,
            "resume": True,
            "data-dir": "",
            "partition": "shards",
        }
    )
    path = tmp_path / "deep" / "config.yaml"
    cfg.save(path)
    assert path.is_file()
    again = config_schema.load(path)
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


def test_run_dir_is_absolute(tmp_path):
    cfg = config_schema.build({"output-dir": str(tmp_path), "name": "abc"})
    assert cfg.run_dir == tmp_path.resolve() / "abc"
    assert config_schema.build().run_dir.is_absolute()


# ------------------------------------------------------------- overrides and files


def test_parse_overrides_yaml_scalars():
    out = core.parse_overrides(["lr=0.1", "resume=true", "name=a=b", "data-dir=", " seed = 3"])
    assert out == {"lr": 0.1, "resume": True, "name": "a=b", "data-dir": "", "seed": 3}


def test_parse_overrides_rejects_missing_equals():
    with pytest.raises(ConfigError, match="noequals"):
        core.parse_overrides(["noequals"])


def test_load_yaml_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        core.load_yaml(tmp_path / "missing.yaml")


def test_load_yaml_invalid_yaml(tmp_path):
    path = _write(tmp_path / "bad.yaml", "lr: [0.1\nseed: : :\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        core.load_yaml(path)


@pytest.mark.parametrize(("text", "needle"), [
    ("lr: 0.1\nseed: 1\nlr: 0.01\n", "key 'lr' is given twice (lines 1 and 3)"),
    ("fedcda:\n  warmup: 3\nfedcda:\n  memory: 2\n", "key 'fedcda' is given twice (lines 1 and 3)"),
    ("fedcda: {warmup: 3, warmup: 4}\n", "key 'warmup' is given twice"),
    ("fedcda:\n  warmup: 3\nfedcda.warmup: 4\n", "config key 'fedcda.warmup' is given twice (3 and 4)"),
])
def test_load_yaml_refuses_a_key_given_twice(tmp_path, text, needle):
    """PyYAML keeps the last of two equal keys without a word (a second ``fedcda:`` block
    would drop the first's warmup): refused, naming the key and its lines."""
    path = _write(tmp_path / "dup.yaml", text)
    with pytest.raises(ConfigError) as exc:
        core.load_yaml(path)
    assert needle in str(exc.value)


def test_load_yaml_keeps_nested_and_dotted_keys_that_differ(tmp_path):
    path = _write(tmp_path / "ok.yaml", "lr: 0.1\nfedcda:\n  warmup: 3\nfedcda.memory: 2\n")
    assert core.load_yaml(path) == {"lr": 0.1, "fedcda.warmup": 3, "fedcda.memory": 2}


def test_load_yaml_non_mapping(tmp_path):
    path = _write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        core.load_yaml(path)


def test_load_yaml_unknown_key_rejected_on_build(tmp_path):
    path = _write(tmp_path / "exp.yaml", "lrr: 0.1\n")
    with pytest.raises(ConfigError, match="'lrr'") as exc:
        config_schema.load(path)
    assert "'lr'" in str(exc.value)


def test_describe_lists_every_key():
    text = config_schema.describe()
    for o in SCHEMA.options:
        assert o.key in text


# ------------------------------------------------------------------------ (was test_configuration)


def test_pyproject_run_config_equals_the_code_defaults():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat = core.flatten(table)
    assert flat == DEFAULTS
    assert {k: type(v) for k, v in flat.items()} == {k: type(v) for k, v in DEFAULTS.items()}


def test_defaults_build_and_are_frozen():
    cfg = config_schema.build()
    assert cfg.to_dict() == DEFAULTS
    assert config_schema.from_run_config({}) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]


def test_layers_override_in_order(tmp_path):
    y = tmp_path / "e.yaml"
    y.write_text("lr: 0.2\nseed: 4\nfedprox:\n  mu: 0.5\nstrategy: [fedavg, fedprox]\n")
    cfg = config_schema.load(y, ["seed=9"], run_config={"lr": 0.3, "batch-size": 64})
    assert cfg.lr == 0.2  # YAML over Flower's run config
    assert cfg.seed == 9  # --set over YAML
    assert cfg.batch_size == 64  # run config over defaults
    assert cfg.get("fedprox.mu") == 0.5
    assert cfg.strategy == "fedavg,fedprox" and cfg.strategies == ["fedavg", "fedprox"]


def test_save_and_reload_roundtrip(tmp_path):
    cfg = config_schema.build({"lr": 0.125, "name": "x", "resume": True})
    cfg.save(tmp_path / "c.yaml")
    assert config_schema.load(tmp_path / "c.yaml") == cfg
    assert cfg.replace(seed=3).seed == 3 and cfg.replace(seed=3).lr == 0.125


@pytest.mark.parametrize(
    ("layer", "needles"),
    [
        ({"num-clinets": 3}, ["unknown config key 'num-clinets'", "Did you mean 'num-clients'"]),
        ({"lr": "abc"}, ["'lr' expects float"]),
        ({"lr": -1}, ["'lr' must be > 0"]),
        ({"lr": float("nan")}, ["'lr' expects float"]),
        ({"momentum": 2}, ["'momentum' must be in [0, 1]"]),
        ({"num-clients": 2.5}, ["'num-clients' expects int"]),
        ({"resume": "maybe"}, ["'resume' expects bool"]),
        ({"partition": "dir"}, ["'partition' got 'dir'", "iid, dirichlet, dirichlet-balanced, dirichlet-capped, shards"]),
        ({"strategy": "fedavg,nope"}, ["'strategy' got 'nope'", "fedavg, fedprox"]),
        ({"num-clients": 3, "clients-per-round": 4}, ["'clients-per-round' (4)", "num-clients (3)"]),
    ],
)
def test_bad_keys_and_values_raise_one_clear_error(layer, needles):
    with pytest.raises(ConfigError) as e:
        config_schema.build(layer)
    for n in needles:
        assert n in str(e.value)


def test_value_parsing():
    assert config_schema.coerce("resume", "true") is True and config_schema.coerce("resume", "off") is False
    assert config_schema.coerce("num-clients", 4.0) == 4 and config_schema.coerce("lr", "0.5") == 0.5
    assert core.parse_overrides(["a=1", "b=x y", "c=true", "d="]) == {"a": 1, "b": "x y", "c": True, "d": ""}
    with pytest.raises(ConfigError, match="key=value"):
        core.parse_overrides(["noequals"])


def test_yaml_problems_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        core.load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        core.load_yaml(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        core.load_yaml(lst)


def test_shipped_configs_are_valid():
    for f in sorted((ROOT / "configs").glob("*.yaml")):
        config_schema.load(f)


def test_the_config_takes_every_registered_name_and_refuses_others():
    """Every registered strategy, trainer and model is a value the config accepts; a name
    registered nowhere is refused by name.  ``fedsys.core.MODELS`` is a copy of the model
    registry's names (config validation does not import torch): it must match."""
    from clients import TRAINERS
    from fedsys.models import MODELS
    from strategies import REGISTRY

    for name in REGISTRY:
        assert config_schema.build({"strategy": name}).strategies == [name]
    for name in TRAINERS:
        assert config_schema.build({"trainer": name}).trainer == name
    for name in MODELS:
        assert config_schema.build({"model": name}).model == name
    assert tuple(core.MODELS) == tuple(MODELS)
    for key in ("strategy", "trainer", "model"):
        with pytest.raises(ConfigError, match="nosuch"):
            config_schema.build({key: "nosuch"})


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("fedcda-dir0.1", ["name=fedcda-dir0.1", "dirichlet-alpha=0.1"]),
        ("fedcda-dir0.3", ["name=fedcda-dir0.3", "dirichlet-alpha=0.3",
                           "strategy=fedavg,fedcda,fedcda[fedcda.selection=newest],"
                           "fedcda[fedcda.selection=random]"]),
        ("fedcda-dir0.5", ["name=fedcda-dir0.5", "dirichlet-alpha=0.5"]),
        ("fedcda-shards2", ["name=fedcda-shards2", "partition=shards", "shards-per-client=2"]),
        ("fedcda-paper-dir0.3", ["name=fedcda-paper-dir0.3", "dirichlet-alpha=0.3",
                                 "num-server-rounds=200", "local-epochs=20", "lr=0.001",
                                 "fedcda.warmup=50"]),
    ],
)
def test_fedcda_presets_equal_the_documented_commands(preset, overrides):
    """Each per-setting preset is the base config plus the overrides docs/results/fedcda.md ran."""
    want = config_schema.load(ROOT / "configs" / "fedcda-fmnist.yaml", overrides)
    got = config_schema.load(ROOT / "configs" / f"{preset}.yaml")
    assert got == want


def test_a_variant_may_name_its_results_directory():
    from fedsys.config import parse_strategy
    from fedsys_launch.config_schema import schema

    vs = parse_strategy("fedavg[trainer=lss;lr=0.001] as fedavg+lss, fedavg", schema())
    assert [v.label for v in vs] == ["fedavg+lss", "fedavg"]
    assert vs[0].overrides == (("trainer", "lss"), ("lr", 0.001))
    assert vs[0].spec == "fedavg[trainer=lss;lr=0.001] as fedavg+lss"
    with pytest.raises(ConfigError, match="label 'a/b'"):
        parse_strategy("fedavg as a/b", schema())
    with pytest.raises(ConfigError, match="twice"):
        parse_strategy("fedavg[lr=0.1] as x, fedprox as x", schema())


def test_seeds_parse_and_each_seed_is_a_run_of_its_own(tmp_path):
    from fedsys.config import parse_seeds
    from fedsys_launch.commands.cli import seed_config
    from fedsys_launch.config_schema import build

    assert parse_seeds("") == [] and parse_seeds("2, 0,1") == [2, 0, 1]
    for bad in ["a", "1,1", "-1"]:
        with pytest.raises(ConfigError, match="'seeds'"):
            parse_seeds(bad)
    cfg = build({"dataset": "synthetic", "model": "mlp", "num-clients": 3, "clients-per-round": 3,
                 "seeds": [0, 2], "name": "x", "output-dir": str(tmp_path)})
    assert cfg.seeds == "0,2"
    one = seed_config(cfg, 2)
    assert (one.seed, one.seeds, one.name) == (2, "", "seed-2")
    assert one.run_dir == tmp_path / "x" / "seed-2"
    with pytest.raises(ConfigError, match=r"\{seed\}"):
        seed_config(cfg.replace(**{"branch-from": "runs/p/fedavg/checkpoint-r0002.pt"}), 0)
    b = seed_config(cfg.replace(**{"branch-from": "runs/p/seed-{seed}/x.pt"}), 2)
    assert b.branch_from == "runs/p/seed-2/x.pt"
    with pytest.raises(ConfigError, match="may not change 'seeds'"):
        build({"strategy": "fedavg[seeds=1]"})


def test_the_sync_script_makes_the_committed_tables_and_replaces_stale_ones():
    """scripts/sync_pyproject_config.py (what docs/extending.md asks a new method's author
    to run) rewrites the tables from the schema: on the committed file it changes nothing,
    and a stale table comes back as the schema's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync", ROOT / "scripts" / "sync_pyproject_config.py")
    assert spec is not None and spec.loader is not None
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    toml = core.to_toml(config_schema.schema())
    text = PYPROJECT.read_text()
    assert sync.synced(text, toml) == text
    stale = text.replace("[tool.flwr.app.config.fedavgm]\n", "[tool.flwr.app.config.fedavgm]\nold-key = 1\n")
    assert stale != text and sync.synced(stale, toml) == text


@pytest.mark.parametrize(("text", "inside", "outside"), [
    ("> 0", [1e-300, 1.0, float("inf")], [0.0, -1.0, float("nan")]),
    (">= -1", [-1.0, 0.0, float("inf")], [-1.0001, float("-inf"), float("nan")]),
    ("< 2", [1.999, float("-inf")], [2.0, 3.0, float("nan")]),
    ("<= 2", [2.0, -5.0], [2.0001, float("nan")]),
    ("[0, 1]", [0.0, 0.5, 1.0], [-1e-9, 1.0000001, float("nan")]),
    ("(0, 1]", [1e-12, 1.0], [0.0, 1.5]),
    ("[0, 1)", [0.0, 0.999], [1.0]),
    ("(-inf, inf)", [-1e300, 0.0, 1e300], [float("inf"), float("-inf"), float("nan")]),
    ("[-inf, inf]", [float("-inf"), float("inf")], [float("nan")]),
])
def test_bounds_golden(text: str, inside: list[float], outside: list[float]) -> None:
    from fedsys.options import bounds_check

    check = bounds_check(text)
    assert all(check(x) is True for x in inside), text
    assert all(check(x) is False for x in outside), text
    for x in (5, 0, -3):  # ints as floats
        assert check(x) == check(float(x))


def test_a_run_config_pickles_whole() -> None:
    import pickle

    cfg = config_schema.load(Path("configs/default.yaml"), ["fedcda.warmup=7", "lr=0.02"])
    cfg.get("fedcda.warmup")  # its cached reads travel too, and stay right
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.to_dict() == cfg.to_dict()
    assert back.get("fedcda.warmup") == 7 and back.group("fedcda") == cfg.group("fedcda")
    # the schema's checks still check
    with pytest.raises(ConfigError, match="lr"):
        config_schema.from_run_config({**back.to_dict(), "lr": -1.0})
