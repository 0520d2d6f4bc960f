"""``scripts/metrics_identical.py``, the before/after proof of a change: equal trees pass,
a changed number, a changed model tensor or a missing model fail, naming where."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "metrics_identical.py"
spec = importlib.util.spec_from_file_location("metrics_identical", SCRIPT)
assert spec is not None and spec.loader is not None
mi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mi)


def _tree(root: Path) -> Path:
    run = root / "run" / "fedavg"
    run.mkdir(parents=True)
    recs = [{"strategy": "fedavg", "round": r, "accuracy": 0.1 * r, "round-time": r} for r in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    torch.save({"w": torch.arange(4.0), "b": torch.zeros(2)}, run / "model.pt")
    return root


def test_equal_trees_pass_and_a_model_tensor_or_a_number_fails(tmp_path, capsys):
    a = _tree(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "run" / "fedavg" / "metrics.jsonl").write_text(
        (b / "run" / "fedavg" / "metrics.jsonl").read_text().replace('"round-time": 2', '"round-time": 9'))
    assert mi.main([str(a), str(b)]) == 0  # wall-clock keys aside
    assert "IDENTICAL (9 values and the model)" in capsys.readouterr().out

    torch.save({"w": torch.tensor([0.0, 1.0, 2.0, 3.0000002]), "b": torch.zeros(2)},
               b / "run" / "fedavg" / "model.pt")
    assert mi.main([str(a), str(b)]) == 1
    assert "'w' differs" in capsys.readouterr().out

    (b / "run" / "fedavg" / "model.pt").unlink()
    assert mi.main([str(a), str(b)]) == 1
    assert "no model.pt" in capsys.readouterr().out

    shutil.rmtree(b)
    shutil.copytree(a, b)
    log = b / "run" / "fedavg" / "metrics.jsonl"
    log.write_text(log.read_text().replace('"accuracy": 0.2', '"accuracy": 0.20000000000000004'))
    assert mi.main([str(a), str(b)]) == 1
    assert "'accuracy' 0.2 != 0.20000000000000004" in capsys.readouterr().out


def test_an_empty_tree_is_not_called_identical(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    assert mi.main([str(tmp_path / "a"), str(_tree(tmp_path / "b"))]) == 1
    out = capsys.readouterr().out
    assert "nothing compared" in out and "IDENTICAL" not in out
