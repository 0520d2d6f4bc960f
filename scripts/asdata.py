"""Typed descriptions kept as data: a YAML file read into frozen dataclasses (issue 66 item
5), and back.

The results pages (``docs/results/pages/<page>.yaml``, read by ``scripts/report.py``) and
the experiment matrix (``configs/experiments/<group>.yaml``, read by
``scripts/reproduce.py``) are written as YAML and read by :func:`load`, which builds the
dataclass a file describes from its fields' types: a YAML list becomes the tuple a field
declares, a mapping the mapping, kebab-case keys the snake-case fields; a key the dataclass
has no field for, or a value of the wrong kind, is an error naming the file, the place and
the fields there are.  :func:`dump` writes one back (what wrote the files first).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class DataError(ValueError):
    """A data file that does not describe what its reader expects."""


def _field_name(key: str) -> str:
    return key.replace("-", "_")


def load(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed YAML) as the type ``tp`` (a dataclass, a tuple, a mapping, a
    union with ``None``, or a scalar); ``where`` names the place in errors."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise DataError(f"{where}: expected a mapping of {tp.__name__}'s fields, got {value!r}")
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        out = {}
        for key, v in value.items():
            name = _field_name(str(key))
            if name not in names:
                near = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {near[0].replace('_', '-')!r}?)" if near else ""
                raise DataError(f"{where}: {tp.__name__} has no field {key!r}{hint}; its fields: "
                                f"{', '.join(sorted(n.replace('_', '-') for n in names))}")
            out[name] = load(hints[name], v, f"{where}.{key}")
        try:
            return tp(**out)
        except TypeError as exc:
            raise DataError(f"{where}: {exc}") from None
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):  # NamedTuple
        if not isinstance(value, Mapping):
            raise DataError(f"{where}: expected a mapping of {tp.__name__}'s fields, got {value!r}")
        hints = typing.get_type_hints(tp)
        got = {_field_name(str(k)): v for k, v in value.items()}
        if wrong := sorted(set(got) ^ set(tp._fields)):
            raise DataError(f"{where}: {tp.__name__} takes exactly the fields "
                            f"{', '.join(f.replace('_', '-') for f in tp._fields)}; "
                            f"{', '.join(w.replace('_', '-') for w in wrong)} wrong or missing")
        return tp(**{k: load(hints[k], v, f"{where}.{k}") for k, v in got.items()})
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return load(kinds[0], value, where)
        for a in kinds:  # a scalar or a mapping, whichever the value is
            if (typing.get_origin(a) in (dict, Mapping, typing.Mapping)) == isinstance(value, Mapping):
                try:
                    return load(a, value, where)
                except DataError:
                    continue
        raise DataError(f"{where}: {value!r} is none of {tp}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise DataError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(load(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise DataError(f"{where}: expected {len(args)} items, got {len(value)}: {value!r}")
        return tuple(load(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (dict, Mapping, typing.Mapping) or tp in (dict, Mapping):
        k_tp, v_tp = typing.get_args(tp) or (Any, Any)
        if not isinstance(value, Mapping):
            raise DataError(f"{where}: expected a mapping, got {value!r}")
        return {load(k_tp, k, where): load(v_tp, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise DataError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def read(path: Path, tp: type[T]) -> dict[str, T]:
    """The file ``path``: a mapping of names to ``tp`` descriptions."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(raw, Mapping):
        raise DataError(f"{path}: expected a mapping of names to descriptions")
    return {str(k): load(tp, v, f"{path.name}: {k}") for k, v in raw.items()}


def plain(obj: Any) -> Any:
    """``obj`` as YAML's plain data, the fields a dataclass leaves at their defaults
    left out, its snake-case names kebab-case."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            default = (f.default if f.default is not dataclasses.MISSING
                       else f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else dataclasses.MISSING)
            if default is not dataclasses.MISSING and v == default:
                continue
            out[f.name.replace("_", "-")] = plain(v)
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple
        return {f.replace("_", "-"): plain(v) for f, v in zip(obj._fields, obj, strict=True)}
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


class _Dumper(yaml.SafeDumper):
    """Mappings in block style, lists of scalars in flow style (one line each)."""


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(not isinstance(v, list | dict) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


def _dict(dumper: yaml.SafeDumper, data: dict[Any, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


_Dumper.add_representer(list, _list)
_Dumper.add_representer(dict, _dict)


def dump(named: Mapping[str, Any], head: str = "") -> str:
    """YAML of ``named`` (name -> dataclass), after the comment lines ``head``."""
    body = yaml.dump({k: plain(v) for k, v in named.items()}, Dumper=_Dumper, sort_keys=False,
                     allow_unicode=True, width=1000)
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in head.splitlines()) + body


__all__ = ["DataError", "dump", "load", "plain", "read"]
