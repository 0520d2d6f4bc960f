"""The package's shape: layering, one message protocol, config without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fedsys import protocol

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedsys", "strategies", "clients", "launch")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).glob("*.py")):
            name = pkg if p.stem == "__init__" else f"{pkg}.{p.stem}"
            out[name] = p
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
        above = {"fedsys": ("strategies", "clients", "launch"), "strategies": ("launch", "clients"),
                 "clients": ("launch", "strategies"), "launch": ()}[top]
        bad = sorted(d for d in deps if d.split(".")[0] in above)
        assert not bad, f"{mod} imports {bad} (layer {top} may not)"


def test_no_import_cycles():
    graph = _graph()

    def visit(m: str, path: list[str]) -> None:
        for d in graph[m]:
            assert d not in path, f"import cycle: {' -> '.join([*path, d])}"
            visit(d, [*path, d])

    for m in graph:
        visit(m, [m])


MESSAGE_KEYS = {protocol.ARRAYS, protocol.METRICS, protocol.NUM_EXAMPLES, protocol.PARTITION_ID,
                protocol.NUM_PARTITIONS, protocol.TRAIN_LOSS, protocol.EVAL_LOSS,
                protocol.EVAL_ACC, protocol.SERVER_ROUND, protocol.MODEL_PREFIX,
                protocol.STATE_PREFIX, protocol.STATE_SCOPE}


def test_no_message_key_is_spelled_outside_the_protocol():
    hits = []
    for mod, path in _modules().items():
        if mod == "fedsys.protocol":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in MESSAGE_KEYS:
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not hits, "message keys written as literals:\n" + "\n".join(hits)


def test_config_validation_imports_neither_torch_nor_ray():
    code = ("import sys; from launch import registry; "
            "c = registry.load('configs/default.yaml', ['fedcda.memory=4']); "
            "registry.make_strategy(c.variants()[2][1]); "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("mod", sorted(_modules()))
def test_every_module_has_a_docstring(mod):
    assert ast.get_docstring(ast.parse(_modules()[mod].read_text())), mod
