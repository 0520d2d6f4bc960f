"""Docker proof: both images from a local base, the compose stack on 127.0.0.1 with
TLS and node authentication, two rounds of FedAvg on Fashion-MNIST, torn down.

Runs ``scripts/docker_proof.sh``; skipped only where no Docker engine answers.  The
first run builds the images (several GB of CUDA torch wheels): tens of minutes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.deploy,
    pytest.mark.docker,
    pytest.mark.skipif(not _docker_engine(), reason="no Docker engine on this machine"),
]


def test_compose_stack_runs_fedavg_over_tls_with_node_auth() -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "docker_proof.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=3 * 3600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PROOF OK" in out and "SuperLink served HTTPS" in out, out[-4000:]
    assert "nothing of fedsys-proof is running" in out, out[-4000:]
