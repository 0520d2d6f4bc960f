"""The config: defaults in sync with pyproject, layering, and errors that name the key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from fedsys import config as cfgmod

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_run_config_equals_the_code_defaults():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat = cfgmod.flatten(table)
    assert flat == cfgmod.DEFAULTS
    assert {k: type(v) for k, v in flat.items()} == {k: type(v) for k, v in cfgmod.DEFAULTS.items()}


def test_defaults_build_and_are_frozen():
    cfg = cfgmod.build()
    assert cfg.to_dict() == cfgmod.DEFAULTS
    assert cfgmod.from_run_config({}) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]


def test_layers_override_in_order(tmp_path):
    y = tmp_path / "e.yaml"
    y.write_text("lr: 0.2\nseed: 4\nfedprox:\n  mu: 0.5\nstrategy: [fedavg, fedprox]\n")
    cfg = cfgmod.load(y, ["seed=9"], run_config={"lr": 0.3, "batch-size": 64})
    assert cfg.lr == 0.2  # YAML over Flower's run config
    assert cfg.seed == 9  # --set over YAML
    assert cfg.batch_size == 64  # run config over defaults
    assert cfg.fedprox__mu == 0.5
    assert cfg.strategy == "fedavg,fedprox" and cfg.strategies == ["fedavg", "fedprox"]


def test_save_and_reload_roundtrip(tmp_path):
    cfg = cfgmod.build({"lr": 0.125, "name": "x", "resume": True})
    cfg.save(tmp_path / "c.yaml")
    assert cfgmod.load(tmp_path / "c.yaml") == cfg
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
        ({"partition": "dir"}, ["'partition' got 'dir'", "iid, dirichlet, shards"]),
        ({"strategy": "fedavg,nope"}, ["'strategy' got 'nope'", "fedavg, fedprox"]),
        ({"num-clients": 3, "clients-per-round": 4}, ["'clients-per-round' (4)", "num-clients (3)"]),
    ],
)
def test_bad_keys_and_values_raise_one_clear_error(layer, needles):
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.build(layer)
    for n in needles:
        assert n in str(e.value)


def test_value_parsing():
    assert cfgmod.coerce("resume", "true") is True and cfgmod.coerce("resume", "off") is False
    assert cfgmod.coerce("num-clients", 4.0) == 4 and cfgmod.coerce("lr", "0.5") == 0.5
    assert cfgmod.parse_overrides(["a=1", "b=x y", "c=true", "d="]) == {"a": 1, "b": "x y", "c": True, "d": ""}
    with pytest.raises(cfgmod.ConfigError, match="key=value"):
        cfgmod.parse_overrides(["noequals"])


def test_yaml_problems_are_config_errors(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="not found"):
        cfgmod.load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(cfgmod.ConfigError, match="not valid YAML"):
        cfgmod.load_yaml(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(cfgmod.ConfigError, match="mapping"):
        cfgmod.load_yaml(lst)


def test_shipped_configs_are_valid():
    for f in sorted((ROOT / "configs").glob("*.yaml")):
        cfgmod.load(f)


def test_config_names_match_the_registries():
    from clients import TRAINERS
    from fedsys.models import MODELS
    from strategies import REGISTRY

    assert set(cfgmod.STRATEGIES) == set(REGISTRY)
    assert set(cfgmod.TRAINERS) == {"auto", *TRAINERS}
    assert set(cfgmod.MODELS) == set(MODELS)


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("fedcda-dir0.1", ["name=fedcda-dir0.1", "dirichlet-alpha=0.1"]),
        ("fedcda-dir0.3", ["name=fedcda-dir0.3", "dirichlet-alpha=0.3",
                           "strategy=fedavg,fedcda,fedcda[fedcda.selection=newest],"
                           "fedcda[fedcda.selection=random]"]),
        ("fedcda-dir0.5", ["name=fedcda-dir0.5", "dirichlet-alpha=0.5"]),
        ("fedcda-shards2", ["name=fedcda-shards2", "partition=shards", "shards-per-client=2"]),
    ],
)
def test_fedcda_presets_equal_the_documented_commands(preset, overrides):
    """Each per-setting preset is the base config plus the overrides docs/results/fedcda.md ran."""
    want = cfgmod.load(ROOT / "configs" / "fedcda-fmnist.yaml", overrides)
    got = cfgmod.load(ROOT / "configs" / f"{preset}.yaml")
    assert got == want
