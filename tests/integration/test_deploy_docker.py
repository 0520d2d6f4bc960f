"""Docker proof: both images from a local base, the compose stack on 127.0.0.1 with
TLS and node authentication, two rounds of FedAvg on Fashion-MNIST, torn down.

Runs ``scripts/docker_proof.sh``; skipped only where no Docker engine answers.  The
first run builds the images (several GB of CUDA torch wheels): 5-10 minutes.  In CI,
``.ci/run`` starts an engine and builds the images while pip sets up the venv
(``scripts/ci_docker.sh``); this test waits for that, then builds again (every layer
cached, so a broken Dockerfile or source still fails here) and runs the stack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def _ci_engine() -> str:
    """Where ``.ci/run`` is starting an engine in the background (``scripts/ci_docker.sh``,
    its ready file in ``FEDSYS_CI_DOCKER_READY``): wait for it and return what it wrote
    (``ok``, ``build-failed`` or ``no-engine: why``); elsewhere ``""``."""
    ready = os.environ.get("FEDSYS_CI_DOCKER_READY")
    if not ready:
        return ""
    end = time.monotonic() + 40 * 60
    while not Path(ready).exists():
        if time.monotonic() > end:
            pytest.fail(f"scripts/ci_docker.sh wrote nothing to {ready} in 40 min; "
                        f"see {ready}.log")
        time.sleep(5)
    return Path(ready).read_text().strip()


pytestmark = [pytest.mark.slow, pytest.mark.deploy, pytest.mark.docker]


def test_compose_stack_runs_fedavg_over_tls_with_node_auth() -> None:
    ci = _ci_engine()
    if ci.startswith("no-engine") or not _docker_engine():
        pytest.skip(f"no Docker engine on this machine{' (' + ci + ')' if ci else ''}")
    # the caller's Python leaking into Debian's docker-compose once broke CI (the venv's
    # cryptography under Debian's pyOpenSSL): run the proof with that leak in place
    leak = os.pathsep.join([sysconfig.get_paths()["purelib"], "/usr/lib/python3/dist-packages"])
    env = {**os.environ, "PYTHONPATH": leak, "PYTHONHOME": sys.base_prefix}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "docker_proof.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3 * 3600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PROOF OK" in out and "SuperLink served HTTPS" in out, out[-4000:]
    assert "nothing of fedsys-proof is running" in out, out[-4000:]


def test_role_compose_files_run_a_server_kit_and_two_sites() -> None:
    """``scripts/docker_kits_proof.sh``: the server role from ``deploy/server.compose.yml``
    and two sites from ``deploy/site.compose.yml``, each with its kit's env file and on a
    bridge of its own that reaches only the server's published port; both sites
    registered with the ``sites`` tool, a two-round run with both, everything removed."""
    ci = _ci_engine()
    if ci.startswith("no-engine") or not _docker_engine():
        pytest.skip(f"no Docker engine on this machine{' (' + ci + ')' if ci else ''}")
    leak = os.pathsep.join([sysconfig.get_paths()["purelib"], "/usr/lib/python3/dist-packages"])
    env = {**os.environ, "PYTHONPATH": leak, "PYTHONHOME": sys.base_prefix}
    cli = Path(sys.executable).parent / "fedsys"
    if cli.exists():
        env["FEDSYS_CLI"] = str(cli)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "docker_kits_proof.sh")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=3600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PROOF OK" in out and "both sites in every round" in out, out[-4000:]
    assert "reaches the server's published port and nothing else" in out, out[-4000:]
    assert "nothing of fedsys-kits is running" in out, out[-4000:]
