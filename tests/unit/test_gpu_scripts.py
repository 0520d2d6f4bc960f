"""The GPU box's unit runner (``scripts/gpu_units.sh``): every unit of a method's presets
run once, a finished unit skipped, a unit cut off resumed from its checkpoint; run here with
a stand-in for the ``fedsys`` command that records its calls and writes what a run leaves
(``model.pt``, ``metrics.jsonl``), so that the runner's own logic is what is tested.  And
every shell script of ``scripts/`` parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the stand-in ``fedsys``: ``run ... --set output-dir=D --set name=u --set strategy=S``
#: writes D/u/<label>/{model.pt,metrics.jsonl}; ``resume D/u`` finishes each strategy
#: folder there that holds a checkpoint; every call is appended to $STUB_LOG
STUB = r'''
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
def finish(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt").write_bytes(b"model")
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 3, "accuracy": 0.5}) + "\n")
if args[0] == "run":
    sets = dict(a.split("=", 1) for a in args[args.index("--set"):] if "=" in a)
    label = sets["strategy"].split(" as ")[-1].split("[")[0]
    finish(Path(sets["output-dir"]) / sets["name"] / label)
elif args[0] == "resume":
    for ck in Path(args[1]).glob("*/checkpoint.pt"):
        finish(ck.parent)
'''


def _units(tmp_path: Path, seeds: str) -> tuple[str, list[list[str]]]:
    """One call of the runner for FedCDA's paper-schedule preset; its output and the
    stand-in's calls so far."""
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "FEDSYS": f"{sys.executable} {stub}", "STUB_LOG": str(log),
           "OUT_RUNS": str(tmp_path / "runs"), "SEEDS": seeds, "JOBS": "2", "DEVICE": "cpu",
           "GPUS": "0", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_units.sh"), "fedcda",
                           "paper-dir0.3"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return proc.stdout, calls


def test_each_unit_runs_once_and_a_cut_unit_goes_on_from_its_checkpoint(tmp_path):
    out, calls = _units(tmp_path, "0 1")
    runs = tmp_path / "runs" / "paper-dir0.3"
    done = sorted(str(p.relative_to(runs)) for p in runs.glob("seed-*/*/metrics.jsonl"))
    assert done == [f"seed-{s}/{lab}/metrics.jsonl" for s in (0, 1) for lab in ("fedavg", "fedcda")]
    assert sorted((c[0], c[c.index("--set") + 1]) for c in calls) == sorted(
        [("run", "seed=0")] * 2 + [("run", "seed=1")] * 2)
    assert out.count("(new): done") == 4, out
    # again: every unit is there, nothing runs
    out, again = _units(tmp_path, "0 1")
    assert again == calls and "done" not in out
    # a unit cut off after a checkpoint (its records kept in the runner's .tmp): resumed
    cut = tmp_path / "runs" / ".tmp" / "paper-dir0.3-1-fedcda" / "u" / "fedcda"
    cut.mkdir(parents=True)
    (cut / "checkpoint.pt").write_bytes(b"state")
    (cut / "metrics.jsonl").write_text(json.dumps({"round": 40, "accuracy": 0.4}) + "\n")
    (runs / "seed-1" / "fedcda" / "metrics.jsonl").unlink()
    out, after = _units(tmp_path, "0 1")
    assert after[len(calls):] == [["resume", str(cut.parent)]]
    assert "seed 1 fedcda (resumed from round 40): done" in out, out
    finished = runs / "seed-1" / "fedcda"
    # the leftover without records replaced, not the resumed run moved into it
    assert sorted(p.name for p in finished.iterdir()) == ["checkpoint.pt", "metrics.jsonl",
                                                          "model.pt"]
    assert all(p.stat().st_size == 0 for p in finished.glob("*.pt"))  # the records are kept


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
