"""A run killed mid-way (SIGKILL of its whole process group: driver and Ray workers) and
``fedsys resume``d ends bit-identical to the same run uninterrupted, in Flower's real
simulation engine and in fedsys's in-process engine (``engine: inprocess``; synthetic data).
Its own module so that it runs beside test_simulation.py (the two runs take minutes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from fedsys import checkpoint, metrics
from tests.integration.test_simulation import BASE

pytestmark = pytest.mark.slow



def _fedsys(*args: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "fedsys_launch", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize("engine", ["flower", "inprocess"])
@pytest.mark.parametrize(("strategy", "label"), [
    ("fedavg", "fedavg"),
    # IMA over FedCDA with its cache on disk: the IMA window, FedCDA's cache, selections
    # and sums all come back exactly
    ("ima[ima.base=fedcda;ima.start-round=3;ima.window=2;fedcda.warmup=2;fedcda.cache=disk]",
     "ima-base-fedcda-start-round-3-window-2-warmup-2-cache-disk"),
])
def test_killed_run_resumes_to_identical_weights(tmp_path, strategy, label, engine):
    # the reference runs in the suite's shared Ray cluster (the same numbers as in a run's
    # own: test_a_run_in_the_shared_ray_cluster_equals_one_in_its_own); for FedAvg the
    # victim and its resume run as a user runs them, the kill taking the run's own cluster too
    # (the in-process engine starts no Ray: its kill takes the one process)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" or label != "fedavg"}
    sets = [f"--set={k}={v}" for k, v in {**BASE, "output-dir": tmp_path, "strategy": strategy,
                                           "num-server-rounds": 6, "local-epochs": 15,
                                           "clients-per-round": 2, "engine": engine}.items()]
    ref = _fedsys("run", *sets, "--set=name=ref")
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()[-2000:]

    victim = _fedsys("run", *sets, "--set=name=victim", env=env)
    ck = tmp_path / "victim" / label / "checkpoint.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        if ck.exists() and checkpoint.load(ck)["round"] >= 2:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # the whole process group: driver and Ray workers
    victim.wait(timeout=60)
    killed_at = checkpoint.load(ck)["round"]
    assert 2 <= killed_at < 6, "the kill must land mid-run"
    assert not (tmp_path / "victim" / label / "model.pt").exists()

    resumed = _fedsys("resume", str(tmp_path / "victim"), env=env)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]

    a = torch.load(tmp_path / "ref" / label / "model.pt")
    b = torch.load(tmp_path / "victim" / label / "model.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = metrics.read_jsonl(tmp_path / "ref" / label / "metrics.jsonl")
    rb = metrics.read_jsonl(tmp_path / "victim" / label / "metrics.jsonl")
    assert [r["round"] for r in rb] == list(range(7))
    assert [r["accuracy"] for r in ra] == [r["accuracy"] for r in rb]
    for key in ("bytes-down", "bytes-up", "trained-examples", "clients-reached"):
        assert [r.get(key) for r in ra] == [r.get(key) for r in rb], key  # counted across resume
    if label.startswith("ima"):
        assert [r.get("fedcda-objective") for r in ra] == [r.get("fedcda-objective") for r in rb]
        assert ra[-1]["fedcda-warmup"] == 0.0  # selection was running when killed/resumed
        assert [r.get("ima-active") for r in rb][1:] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
