"""The README's own Flower app (``examples/flower-app``) works as written: a ServerApp and a
ClientApp from Flower's quickstart, fedsys strategies built with Flower's keywords,
``flwr run`` in Flower's local simulation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch.deploy import descendants, free_port
from launch.simulation import FLWR_ENV

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmd.read_bytes():
                out.append(int(cmd.parent.name))
        except OSError:
            continue
    return out


def test_the_readme_flower_app_runs_with_a_fedsys_strategy(tmp_path):
    strategy = "fedcda"  # the one that needs the most of a client (train-loss, node-id keys)
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(home),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = tmp_path / "result.json"
    try:
        proc = subprocess.run(
            ["flwr", "run", str(APP), "--stream", "--federation-config", "num-supernodes=4",
             "--run-config", f"strategy='{strategy}' out='{out}'"],
            cwd=home, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:  # the local SuperLink is a detached daemon: stop it by PID
        for pid in [d for p in _procs_mentioning(str(home)) for d in descendants(p)]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    acc = {int(k): v for k, v in json.loads(out.read_text())["accuracy"].items()}
    assert sorted(acc) == list(range(7))  # num-server-rounds = 6 from the app's own config
    assert acc[6] > acc[0] + 0.2
