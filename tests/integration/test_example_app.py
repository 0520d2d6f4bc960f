"""The README's own Flower app (``examples/flower-app``) works as written: a ServerApp and a
ClientApp from Flower's quickstart, fedsys strategies built with Flower's keywords,
``flwr run`` in Flower's local simulation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


def test_the_readme_flower_app_runs_with_a_fedsys_strategy(tmp_path, flwr_local):
    strategy = "fedcda"  # the one that needs the most of a client (train-loss, node-id keys)
    out = tmp_path / "result.json"
    proc = subprocess.run(
        ["flwr", "run", str(APP), "--stream", "--federation-config", "num-supernodes=4",
         "--run-config", f"strategy='{strategy}' out='{out}'"],
        cwd=flwr_local.home, env=flwr_local.env, capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    acc = {int(k): v for k, v in json.loads(out.read_text())["accuracy"].items()}
    assert sorted(acc) == list(range(7))  # num-server-rounds = 6 from the app's own config
    assert acc[6] > acc[0] + 0.2
