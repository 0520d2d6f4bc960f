"""The package's shape: layering, one message protocol, config without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fedsys import protocol

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedsys", "strategies", "clients", "fedsys_launch")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(path: Path) -> set[str]:
    """Every module imported anywhere in the file (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_the_core_imports_nothing_above_it_and_the_sides_not_the_launchers():
    for mod, deps in _graph().items():
        top = mod.split(".")[0]
        above = {"fedsys": ("strategies", "clients", "fedsys_launch"),
                 "strategies": ("fedsys_launch", "clients"),
                 "clients": ("fedsys_launch", "strategies"), "fedsys_launch": ()}[top]
        bad = sorted(d for d in deps if d.split(".")[0] in above)
        assert not bad, f"{mod} imports {bad} (layer {top} may not)"


#: fedsys_launch's rooms, each importing only itself, the rooms after it and the shared
#: modules at the package's top (config_schema, flower_patches with runtime_auth, recording)
ROOMS = ("commands", "engines", "deploy", "apps", "process")


def test_the_launchers_rooms_import_downward():
    for mod, deps in _graph().items():
        parts = mod.split(".")
        if parts[0] != "fedsys_launch" or len(parts) < 3:
            continue
        below = ROOMS[ROOMS.index(parts[1]):]
        bad = sorted(d for d in deps if d.startswith("fedsys_launch.")
                     and d.count(".") >= 1 and d.split(".")[1] in ROOMS
                     and d.split(".")[1] not in below)
        assert not bad, f"{mod} imports {bad} (room {parts[1]} may import only {below})"


def _private_writes(path: Path) -> set[str]:
    """The private attributes (``self._x = ...``, ``self._x += ...``) a file assigns."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and sub.attr.startswith("_")
                        and not sub.attr.startswith("__") and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"):
                    out.add(sub.attr)
    return out


def test_no_module_writes_the_private_fields_another_module_sets():
    """A class keeps its own private state: a subclass in another module that assigned
    its base's ``self._x`` (as FedELMY's parallel round once set the base's round state)
    would be changing the base behind its back."""
    writes = {m: _private_writes(p) for m, p in _modules().items()}
    clashes = sorted((a, b, sorted(writes[a] & writes[b])) for a in writes for b in writes
                     if a < b and writes[a] & writes[b])
    assert not clashes, clashes


def test_no_import_cycles():
    graph = _graph()

    def visit(m: str, path: list[str]) -> None:
        for d in graph[m]:
            assert d not in path, f"import cycle: {' -> '.join([*path, d])}"
            visit(d, [*path, d])

    for m in graph:
        visit(m, [m])


#: Protocol constants whose spelling is also a config key or command-line name by design:
#: an instruction's local-training settings carry the config key they override
#: (``local-epochs``, ``lr``, ...), and ``config`` names Flower's ConfigRecord as well as the
#: YAML argument of the command line.  Every other constant of :mod:`fedsys.protocol` is a
#: message key and may be spelled only there.
SHARED_WITH_CONFIG = {protocol.LR, protocol.BATCH_SIZE, protocol.LOCAL_EPOCHS, protocol.LOCAL_STEPS,
                      protocol.MOMENTUM, protocol.OPTIMIZER, protocol.TRAINABLE,
                      protocol.WEIGHT_DECAY, protocol.TRAINER, protocol.CONFIG}
MESSAGE_KEYS = {v for k, v in vars(protocol).items()
                if k.isupper() and isinstance(v, str) and v not in SHARED_WITH_CONFIG}


def test_the_keys_shared_with_the_config_are_config_keys():
    """The exemption above cannot hide a message key: each one is a config key (``config``
    aside, the YAML argument)."""
    from fedsys_launch.config_schema import schema

    keys = set(schema().by_key)
    assert {k for k in SHARED_WITH_CONFIG if k not in keys} == {protocol.CONFIG}
    assert protocol.TRAINED_EXAMPLES in MESSAGE_KEYS and len(MESSAGE_KEYS) >= 15


def test_config_validation_imports_neither_torch_nor_ray():
    code = ("import sys; from fedsys_launch import config_schema; "
            "c = config_schema.load('configs/default.yaml', ['fedcda.memory=4']); "
            "config_schema.make_strategy(c.variants()[2][1]); "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("mod", sorted(_modules()))
def test_every_module_has_a_docstring(mod):
    assert ast.get_docstring(ast.parse(_modules()[mod].read_text())), mod


def test_commands_without_data_start_without_torch():
    """``fedsys --help``, ``keys`` and the ``deploy`` actions (up, status, down, the
    submission) read no data: building the parser and the error handling of ``main`` import
    no torch (about 3 s of CPU for every command otherwise, measured 2026-11-27)."""
    code = ("import sys; from fedsys_launch.commands import cli, deploy_cli, results; cli.parser(); "
            "from fedsys.data import DataError; from fedsys.partition import PartitionError; "
            "bad = [m for m in ('torch', 'ray', 'torchvision') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_hook_is_defined_on_two_bases_and_none_is_a_stub_the_base_overrides():
    """Issue 66 item 1: the three levels of a strategy (the method's hooks, Flower's API over
    them, the strategy built from its keywords) define each method once (a stub on one
    overridden by another made which ran depend on the bases' order); one line of bases;
    the wrappers are one object the strategy holds, not a base."""
    import inspect
    from itertools import combinations

    from flwr.serverapp.strategy import Strategy

    from strategies.base import FedsysStrategy
    from strategies.hooks import MethodHooks
    from strategies.rounds import RoundEngine
    from strategies.wrapper import WrapperChain

    def own(cls: type) -> set[str]:
        return {n for n, v in vars(cls).items() if inspect.isfunction(v) or isinstance(v, property)}

    levels = (MethodHooks, RoundEngine, FedsysStrategy)
    assert {(a.__name__, b.__name__): own(a) & own(b) for a, b in combinations(levels, 2)} == {
        ("MethodHooks", "RoundEngine"): set(), ("RoundEngine", "FedsysStrategy"): set(),
        ("MethodHooks", "FedsysStrategy"): {"__init__"}}
    assert FedsysStrategy.__mro__[1:4] == (RoundEngine, MethodHooks, Strategy)
    assert isinstance(FedsysStrategy().wrappers, WrapperChain)
    # no method of the levels is a stub that raises for a subclass to fill, but the method's own
    stubs = [n for c in levels for n in own(c) if inspect.isfunction(f := vars(c)[n])
             and "raise NotImplementedError" in inspect.getsource(f)]
    assert stubs == ["aggregate"]


def test_a_methods_round_numbers_come_back_with_its_aggregate() -> None:
    """Issue 66 item 1: a method's round numbers come back with its aggregate (no attribute
    written inside aggregate for the round to pick up)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "strategies"
    assert not [p.name for p in root.glob("*.py") if "self.round_metrics" in p.read_text()]
