"""docs/extending.md, proven: a strategy and a trainer defined in a test module
(``extending_example.py``), each with one option of its own and registered with one
line, run in the real simulation engine through ``fedsys run``, keep trainer state from
round to round, are killed and resumed bit-identically, and no fedsys file is edited.

The run names that module in the ``plugins`` key, so the ServerApp and every ClientApp
(in Ray worker processes) import it and its two registration lines run there too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedsys import checkpoint, metrics

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


SETS = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "num-clients": 3,
        "clients-per-round": 3, "num-server-rounds": 6, "seed": 4, "local-epochs": 1,
        "strategy": "damped", "damped.keep": 0.5, "counting.max-batches": 2,
        "plugins": "extending_example"}


def _fedsys(tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "launch", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp)


def test_a_plugin_strategy_and_trainer_run_keep_state_and_resume_bit_identically(tmp_path):
    sets = [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp_path}.items()]
    ref = _fedsys(tmp_path, "run", *sets, "--set=name=ref")
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()[-3000:]
    recs = metrics.read_jsonl(tmp_path / "ref" / "damped" / "metrics.jsonl")
    assert [r["round"] for r in recs] == list(range(7))
    # the trainer's state lasted from round to round on each node: every node has seen
    # every round (all 3 are sampled each round)
    assert [(r["rounds-seen-min"], r["rounds-seen-max"]) for r in recs[1:]] == [
        (r, r) for r in range(1, 7)]
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]

    victim = _fedsys(tmp_path, "run", *sets, "--set=name=victim")
    ck = tmp_path / "victim" / "damped" / "checkpoint.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        if ck.exists() and checkpoint.load(ck)["round"] >= 2:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    assert 2 <= checkpoint.load(ck)["round"] < 6, "the kill must land mid-run"
    resumed = _fedsys(tmp_path, "resume", str(tmp_path / "victim"))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-3000:]

    a = torch.load(tmp_path / "ref" / "damped" / "model.pt")
    b = torch.load(tmp_path / "victim" / "damped" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rb = metrics.read_jsonl(tmp_path / "victim" / "damped" / "metrics.jsonl")
    assert [r["accuracy"] for r in recs] == [r["accuracy"] for r in rb]
    assert [r["loss"] for r in recs] == [r["loss"] for r in rb]
