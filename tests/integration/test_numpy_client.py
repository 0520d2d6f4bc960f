"""fedsys trainers inside a Flower compat-API app: ``examples/numpy-client/app.py`` (a
``NumPyClient`` from :class:`clients.numpy_client.TrainerClient` under Flower's own
``flwr.server.strategy.FedAvg``) runs in Flower's simulation engine as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
APP = Path(__file__).resolve().parents[2] / "examples" / "numpy-client" / "app.py"


@pytest.mark.parametrize(("trainer", "options"), [
    ("lss", ["lss.ingredients=2"]),  # every other LSS option at its default (issue 40)
    ("fedelmy", ["fedelmy.pool-size=2"]),
])
@pytest.mark.usefixtures("own_ray_cluster")  # the app sizes its own cluster, as Flower's docs do
def test_a_compat_app_trains_with_a_fedsys_trainer(tmp_path, trainer, options):
    out = tmp_path / "history.json"
    proc = subprocess.run(
        [sys.executable, str(APP), "--trainer", trainer, "--rounds", "2", "--nodes", "3",
         "--out", str(out), *[a for o in options for a in ("--option", o)]],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    hist = json.loads(out.read_text())
    acc = {int(k): v for k, v in hist["accuracy"].items()}
    assert sorted(acc) == [1, 2] and all(v == 0 for v in hist["failures"].values())
    assert acc[2] > 0.5 and acc[2] > acc[1] - 0.02
    assert "train-loss" in proc.stdout + proc.stderr  # the trainer's metrics reached FedAvg
