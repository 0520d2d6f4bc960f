"""Declared options: one key's type, default, bounds and help, and its parsing.

A method declares its options where it lives, as a frozen dataclass whose fields are
made with :func:`option`::

    @dataclass(frozen=True)
    class FedProxOptions:
        mu: float = option(0.01, "Proximal coefficient mu (Eq. 2).", bounds=">= 0")

and names the group's key prefix (``fedprox``), so the field ``mu`` is the config key
``fedprox.mu``.  :func:`declared` turns such a class into :class:`Option` rows;
the run configuration (:mod:`fedsys.config`), ``fedsys keys``, ``--set``, YAML presets,
strategy variants, the ``[tool.flwr.app.config]`` table and the typed settings of a
train message are all read from those rows.  Nothing here imports torch or flwr.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Scalar = bool | int | float | str

#: ``choices`` of an option whose values are the registered strategies (less the
#: declaring group itself): resolved when the schema is assembled (IMA's ``base``).
REGISTERED_STRATEGIES: tuple[str, ...] = ("<registered strategies>",)


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

    @property
    def field(self) -> str:
        """The Python name of the key's last part (``fedcda.warmup-mode`` -> ``warmup_mode``)."""
        return self.key.rsplit(".", 1)[-1].replace("-", "_")


_BOUND = re.compile(r"^\s*([\[(])\s*(-?[\d.e+-]+|-inf)\s*,\s*([\d.e+-]+|inf)\s*([\])])\s*$")
_CMP = re.compile(r"^\s*(>=|>|<=|<)\s*(-?[\d.e+-]+)\s*$")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A number's allowed range, as a predicate: above ``lo`` (or at it, unless
    ``lo_open``), below ``hi`` (or at it, unless ``hi_open``); None: no bound on that
    side.  A value of its own (not a closure), so that a config holding it pickles."""

    lo: float | None
    hi: float | None
    lo_open: bool = False
    hi_open: bool = False

    def __call__(self, x: Any) -> bool:
        lo, hi = self.lo, self.hi
        above = lo is None or (x > lo if self.lo_open else x >= lo)
        return bool(above and (hi is None or (x < hi if self.hi_open else x <= hi)))


def bounds_check(text: str) -> Callable[[Any], bool]:
    """A predicate from a bounds string: ``"> 0"``, ``">= -1"``, ``"[0, 1]"``, ``"(0, 1]"``
    (a :class:`Bounds`)."""
    m = _CMP.match(text)
    if m:
        op, v = m.group(1), float(m.group(2))
        return {">": Bounds(v, None, lo_open=True), ">=": Bounds(v, None),
                "<": Bounds(None, v, hi_open=True), "<=": Bounds(None, v)}[op]
    m = _BOUND.match(text)
    if not m:
        raise ValueError(f"bad bounds {text!r}; write '> 0', '>= 0', '[0, 1]' or '(0, 1]'")
    return Bounds(float(m.group(2)), float(m.group(3)), lo_open=m.group(1) == "(",
                  hi_open=m.group(4) == ")")


def option(default: Scalar, help: str, *, choices: Iterable[str] | None = None,
           bounds: str = "") -> Any:
    """A dataclass field declaring one option (see the module docstring).

    Parameters
    ----------
    default : bool, int, float or str
        The default; the field's annotation gives the type.
    help : str
        One sentence for ``fedsys keys`` and the docs.
    choices : iterable of str, optional
        The allowed values of a string option.
    bounds : str, optional
        Allowed range of a number: ``"> 0"``, ``">= 0"``, ``"[0, 1]"``, ``"(0, 1]"``.
    """
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None,
            "bounds": bounds}
    return dataclasses.field(default=default, metadata=meta)


@functools.lru_cache(maxsize=512)
def declared(prefix: str, options_cls: type) -> tuple[Option, ...]:
    """The :class:`Option` rows of an options dataclass, keys ``<prefix>.<field>``
    (read once per class and prefix: every ClientApp message parses its options).

    An empty ``prefix`` gives bare keys (the run's core keys).
    """
    hints = typing.get_type_hints(options_cls)
    rows = []
    for f in dataclasses.fields(options_cls):
        bounds = str(f.metadata.get("bounds", ""))
        typ = hints[f.name]
        if typ not in (bool, int, float, str):
            raise TypeError(f"option {options_cls.__name__}.{f.name}: type {typ} is not "
                            "bool, int, float or str")
        name = f.name.replace("_", "-")
        rows.append(Option(
            f"{prefix}.{name}" if prefix else name, typ, f.default,  # type: ignore[arg-type]
            str(f.metadata.get("help", "")), f.metadata.get("choices"),
            bounds_check(bounds) if bounds else None,
            bounds if not bounds or bounds[0] in "<>" else f"in {bounds}",
        ))
    return tuple(rows)


def suggest(key: str, known: Iterable[str]) -> str:
    """A "Did you mean" hint for an unknown key."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return hint + " Run 'fedsys keys' for the list of keys."


def coerce_value(opt: Option, value: Any) -> Scalar:
    """Convert and validate ``value`` for ``opt``; raise :class:`ConfigError`.

    Booleans accept ``true/false/1/0/yes/no/on/off``; an int refuses a float with a
    fraction; a float refuses NaN and infinities; a string refuses other types, and
    takes a boolean (how YAML reads ``yes``/``on``/``true``...) only where its choices
    spell a switch (:func:`_switch_word`).
    """
    key = opt.key
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
        elif isinstance(value, bool):
            out = _switch_word(opt, value)
        else:
            if not isinstance(value, str | int | float):
                raise ValueError
            out = str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(
            f"config key '{key}' expects {opt.type.__name__}"
            f"{' ' + opt.rule if opt.rule else ''}, got {value!r}"
        ) from None
    if opt.choices not in (None, REGISTERED_STRATEGIES) and str(out) not in opt.choices:
        raise ConfigError(
            f"config key '{key}' got {out!r}; allowed values: {', '.join(opt.choices)}"
        )
    if opt.check is not None and not opt.check(out):
        raise ConfigError(f"config key '{key}' must be {opt.rule}, got {out!r}")
    return out


#: The spellings of a switch that YAML reads as booleans, as (true, false) pairs.
SWITCH_WORDS = (("yes", "no"), ("on", "off"), ("true", "false"))


def _switch_word(opt: Option, value: bool) -> str:
    """A YAML boolean given to a string option: the option's own word for it when its
    choices spell a switch (``lss.include-anchor: yes`` in YAML, ``--set`` or a variant
    reads as ``True``), else :class:`ConfigError` saying how YAML read it."""
    for pair in SWITCH_WORDS:
        if opt.choices is not None and set(pair) <= set(opt.choices):
            return pair[0] if value else pair[1]
    allowed = f"one of {', '.join(opt.choices)}" if opt.choices else "a string"
    raise ConfigError(
        f"config key '{opt.key}' expects {allowed}, got the boolean {value} (YAML reads "
        "yes/no/on/off/true/false as booleans; quote the value if you meant the word)")


def parse_group(options_cls: type, prefix: str, values: Mapping[str, Any]) -> Any:
    """Build an options dataclass from ``{key: value}`` (full keys or field names).

    Unknown keys of the group raise :class:`ConfigError` with a suggestion; missing
    ones take their defaults; every value is coerced and checked.
    """
    rows = {o.key: o for o in declared(prefix, options_cls)}
    by_field = {o.field: o for o in rows.values()}
    kw: dict[str, Scalar] = {}
    for k, v in values.items():
        opt = rows.get(k) or by_field.get(k.replace("-", "_"))
        if opt is None:
            raise ConfigError(f"unknown config key '{k}'.{suggest(k, rows)}")
        kw[opt.field] = coerce_value(opt, v)
    return options_cls(**kw)


def group_values(options: Any, prefix: str) -> dict[str, Scalar]:
    """``{full key: value}`` of an options dataclass instance."""
    cls: type = type(options)
    return {o.key: getattr(options, o.field) for o in declared(prefix, cls)}


__all__ = ["REGISTERED_STRATEGIES", "SWITCH_WORDS", "Bounds", "ConfigError", "Option", "Scalar",
           "bounds_check", "coerce_value", "declared", "group_values", "option", "parse_group", "suggest"]
