"""Every option of every registered method, typed the way a user types it, through the
three ways a value enters a run: ``--set key=value``, a YAML file, and a strategy
variant ``name[key=value]`` (issue 39).  YAML reads ``on``/``off``/``yes``/``no``/
``true``/``false`` as booleans: a switch takes all six words, a string option whose
choices spell a switch gets its own word back, and any other string option refuses a
boolean with a message saying how YAML read it (never a silent ``"True"``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fedsys.config import ConfigError, is_shared, parse_strategy
from fedsys.options import REGISTERED_STRATEGIES, SWITCH_WORDS, Option
from fedsys_launch import config_schema

SCHEMA = config_schema.schema()
METHOD_OPTIONS = [o for o in SCHEMA.options if "." in o.key]
SWITCH = {w: True for w, _ in SWITCH_WORDS} | {w: False for _, w in SWITCH_WORDS}


def _typed(o: Option) -> list[tuple[str, Any]]:
    """``(text a user types, value the run must hold)`` for ``o``."""
    if o.type is bool:
        return list(SWITCH.items())
    if o.choices == REGISTERED_STRATEGIES:
        name = next(s for s in SCHEMA.strategies if s != o.key.split(".")[0])
        return [(name, name)]
    if o.choices:
        return [(c, c) for c in o.choices]
    if o.type is str:
        return [("some-text", "some-text")] if o.default == "" else [(str(o.default), o.default)]
    return [(str(o.default), o.default)]


def _strategy_for(o: Option) -> str:
    prefix = o.key.split(".")[0]
    return prefix if prefix in SCHEMA.strategies else "fedavg"


def _via_set(key: str, text: str) -> Any:
    return config_schema.load(None, [f"{key}={text}"]).get(key)


def _via_yaml(tmp_path: Path, key: str, text: str) -> Any:
    group, leaf = key.split(".", 1)
    path = tmp_path / "c.yaml"
    path.write_text(f"{group}:\n  {leaf}: {text}\n")
    return config_schema.load(path).get(key)


def _via_variant(o: Option, text: str) -> Any:
    """A variant's value (a key every strategy of a run shares, such as
    ``pretrain.*`` or ``attack.*``, cannot be a variant's: the variant is refused, naming
    the key, and the value is read back through ``--set``)."""
    if is_shared(o.key):
        with pytest.raises(ConfigError, match=f"may not change '{re.escape(o.key)}'"):
            parse_strategy(f"{_strategy_for(o)}[{o.key}={text}]", SCHEMA)
        return _via_set(o.key, text)
    (variant,) = parse_strategy(f"{_strategy_for(o)}[{o.key}={text}]", SCHEMA)
    return dict(variant.overrides)[o.key]


def test_every_method_has_options_here():
    prefixes = {o.key.split(".")[0] for o in METHOD_OPTIONS}
    assert {"fedelmy", "fedseq", "lss", "fedcda", "fedcross", "ima", "fedprox",
            "chain"} <= prefixes, prefixes


@pytest.mark.parametrize("opt", METHOD_OPTIONS, ids=lambda o: o.key)
def test_every_option_takes_what_a_user_types_from_set_yaml_and_variants(opt, tmp_path):
    for text, want in _typed(opt):
        got = (_via_set(opt.key, text), _via_yaml(tmp_path, opt.key, text),
               _via_variant(opt, text))
        assert got == (want, want, want), (opt.key, text, got)
        assert all(type(g) is opt.type for g in got), (opt.key, text, got)


STRING_OPTIONS = [o for o in METHOD_OPTIONS if o.type is str]


@pytest.mark.parametrize("opt", STRING_OPTIONS, ids=lambda o: o.key)
def test_a_string_option_never_takes_a_yaml_boolean_silently(opt, tmp_path):
    own = next((p for p in SWITCH_WORDS if opt.choices and set(p) <= set(opt.choices)), None)
    for text, value in SWITCH.items():
        if own is not None:  # its own word back, whichever spelling was typed
            want = own[0] if value else own[1]
            assert _via_set(opt.key, text) == want
            assert _via_yaml(tmp_path, opt.key, text) == want
            assert _via_variant(opt, text) == want
            continue
        if opt.choices and text in opt.choices:
            continue  # cannot happen today: a word that YAML reads as bool in the choices
        for via, args in ((_via_set, (opt.key, text)), (_via_yaml, (tmp_path, opt.key, text)),
                          (_via_variant, (opt, text))):
            with pytest.raises(ConfigError, match=f"'{opt.key}'.*boolean.*quote"):
                via(*args)  # type: ignore[operator]


def test_fedelmy_scaling_is_a_switch_on_by_default():
    o = SCHEMA.by_key["fedelmy.scaling"]
    assert o.type is bool and o.default is True
    assert _via_set("fedelmy.scaling", "off") is False
    (variant,) = parse_strategy("fedelmy[fedelmy.scaling=off]", SCHEMA)
    assert variant.label == "fedelmy-scaling-false"
