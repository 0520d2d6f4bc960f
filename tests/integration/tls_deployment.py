"""The TLS deployment the deployment tests share: ``fedsys deploy up --tls --auth`` with
three SuperNodes on 127.0.0.1 (the topology of ``docker-compose.yml``), module-scoped (each
test module that imports :func:`dep` gets its own, so two modules run side by side), and
the run config and waits its tests use.  Tests: test_deploy_tls.py (runs, resume,
refusals) and test_deploy_faults.py (sites that die mid-round and mid-hop).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from launch.deploy import (
    STATE_FILE,
    LocalDeployment,
    _alive,
)

if TYPE_CHECKING:
    from conftest import FedsysCLI

ROOT = Path(__file__).resolve().parents[2]
NODES = 3
STRATEGIES = ["fedavg", "fedcross"]
# A healthy reply takes 5-25 s on a busy 2-core machine.  Runs without faults wait
# for every reply (a late one would change the results); the node-kill runs wait
# KILL_ROUND_TIMEOUT for the reply that never comes.
ROUND_TIMEOUT = 300.0
KILL_ROUND_TIMEOUT = 45.0
# Every run starts its rounds with all three nodes: the bit-identical comparisons
# (reference, simulation, resume) hold only for the same clients, so a node that is
# slow to reconnect on a loaded machine fails the run by name (NodesUnavailableError)
# after this long instead of the round going on without it.
NODE_WAIT_TIMEOUT = 300.0
RESUME_STRATEGY = STRATEGIES[-1]


def run_config(out: Path, name: str, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "name": name, "output-dir": str(out), "strategy": ",".join(STRATEGIES),
        "dataset": "synthetic", "model": "mlp", "partition": "iid",
        "num-clients": NODES, "clients-per-round": NODES, "min-available-clients": NODES,
        "num-server-rounds": 2, "local-steps": 5, "round-timeout": ROUND_TIMEOUT,
        "node-wait-timeout": NODE_WAIT_TIMEOUT,
    }
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="module", name="dep")
def tls_dep(tmp_path_factory: pytest.TempPathFactory,
        module_fedsys_cli: FedsysCLI) -> Iterator[LocalDeployment]:
    root = tmp_path_factory.mktemp("tls") / "deploy"
    up = module_fedsys_cli.run("deploy", "up", "--nodes", str(NODES), "--tls", "--auth", "--dir", str(root))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "(TLS, node auth)" in up.stdout and f"{NODES} SuperNodes" in up.stdout, up.stdout
        d = LocalDeployment.load(root)
        pids = d.all_pids()
        again = module_fedsys_cli.run("deploy", "up", "--dir", str(root))
        assert again.returncode == 2 and "a deployment is running" in again.stderr, again.stderr
        yield d
    finally:
        if (root / STATE_FILE).exists():  # with what the tests restarted
            pids = sorted(set(pids) | set(LocalDeployment.load(root).all_pids()))
        down = module_fedsys_cli.run("deploy", "down", "--dir", str(root))
    assert down.returncode == 0 and "nothing of" in down.stdout, down.stdout + down.stderr
    assert not [p for p in pids if _alive(p)], "processes left running after down"


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def _wait_for(cond: Any, timeout: float, what: str, proc: subprocess.Popen[Any]) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"flwr run ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


