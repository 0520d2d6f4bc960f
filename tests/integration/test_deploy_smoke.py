"""`fedsys deploy up --insecure / status / down` on 127.0.0.1, one deployment of two
SuperNodes for the module (started and stopped by the CLI): without TLS only when asked,
with one WARNING line saying what that opens; a SuperNode comes online over plain HTTP,
the flwr CLI reaches the Control API, a second `up` is refused, a run that fails on the
server side makes `fedsys deploy run` fail (``flwr run --stream`` itself exits 0 however
the run ended), a run config naming a file of the deployment is refused although the
server's data directory holds it (issue 75), Flower's app template (``flower_template/``,
see test_flower_template.py) trains under IMA over FedCDA on it, and `down` leaves nothing
running; a SuperLink nobody listens on fails `deploy run` without a resume hint.

Runs (`fedsys deploy run`, Fashion-MNIST, the results table, `status` after them) are
proven over TLS with node authentication in tests/integration/test_deploy_tls.py, on one
deployment that the same `fedsys deploy up` / `down` start and stop; the two modes differ
only in the flags `fedsys_launch.deploy.local_deployment.LocalDeployment.command` gives each process
(tests/unit/test_deploy_cli.py).  The template shares this module's deployment (each
deployment costs about 40 s of CPU to start and stop, docs/performance.md).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from fedsys_launch.deploy.local_deployment import STATE_FILE, LocalDeployment
from fedsys_launch.process.supervision import alive, free_port
from tests.integration.test_flower_template import APP, check

if TYPE_CHECKING:
    from conftest import FedsysCLI

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

NODES = 2


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory,
          module_fedsys_cli: FedsysCLI) -> Iterator[LocalDeployment]:
    """``fedsys deploy up --nodes 2 --insecure``, and ``down`` after the module: nothing of
    it left running.  The runs write under the tests' directories (``--roots``); the
    deployment lies outside them (``up`` refuses roots that hold it) but inside the
    server's ``$FEDSYS_DATA``, so only the deny-list keeps a run from reading it."""
    holder = Path(tempfile.mkdtemp(prefix="fedsys-smoke-"))
    root = holder / "deploy"
    module_fedsys_cli.env["FEDSYS_DATA"] = str(holder)
    try:
        up = module_fedsys_cli.run("deploy", "up", "--nodes", str(NODES), "--insecure",
                                   "--dir", str(root),
                                   "--roots", str(tmp_path_factory.getbasetemp()))
    finally:
        del module_fedsys_cli.env["FEDSYS_DATA"]
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"(insecure), {NODES} SuperNodes" in up.stdout, up.stdout
        warning = [line for line in up.stderr.splitlines() if "WARNING" in line]
        assert len(warning) == 1 and "--insecure" in warning[0], up.stderr
        assert "speaks plain HTTP" in warning[0] and "may register a SuperNode" in warning[0]
        dep = LocalDeployment.load(root)
        pids = dep.all_pids()
        yield dep
    finally:
        if (root / STATE_FILE).exists():
            pids = sorted(set(pids) | set(LocalDeployment.load(root).all_pids()))
        down = module_fedsys_cli.run("deploy", "down", "--dir", str(root))
    assert down.returncode == 0 and "nothing of" in down.stdout, down.stdout + down.stderr
    assert not [p for p in pids if alive(p)], "processes left running after down"
    shutil.rmtree(holder, ignore_errors=True)


def test_deploy_cli_up_status_down_without_tls(plain: LocalDeployment, tmp_path: Path,
                                                fedsys_cli: FedsysCLI) -> None:
    d = str(plain.root)
    assert not plain.tls and not plain.auth
    again = fedsys_cli.run("deploy", "up", "--dir", d)
    assert again.returncode == 2 and "a deployment is running" in again.stderr
    # SuperLink, server SuperExec, and a SuperNode with its SuperExec per node
    assert len(plain.all_pids()) >= 2 + 2 * NODES
    assert "--insecure" in Path(f"/proc/{plain.components['superlink'].pid}/cmdline") \
        .read_bytes().decode().split("\0")
    status = fedsys_cli.run("deploy", "status", "--dir", d)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("running") >= 2 + 2 * NODES and "online" in status.stdout, \
        status.stdout
    # the ServerApp waits 1 s for a node more than there are, and raises
    cfg = tmp_path / "one-node-short.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "one-node-short", "output-dir": str(tmp_path / "runs"), "strategy": "fedavg",
        "dataset": "synthetic", "model": "mlp", "num-clients": NODES + 1,
        "clients-per-round": NODES + 1, "min-available-clients": NODES + 1,
        "node-wait-timeout": 1, "num-server-rounds": 1}))
    failed = fedsys_cli.run("deploy", "run", str(cfg), "--dir", d, "--timeout", "300")
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    assert "ended finished:failed (flwr ls)" in failed.stderr, failed.stderr
    assert "submit again with --set resume=true" in failed.stderr
    assert "results:" not in failed.stdout, failed.stdout[-2000:]


def test_a_run_naming_a_file_of_the_deployment_is_refused(plain: LocalDeployment,
                                                          tmp_path: Path,
                                                          fedsys_cli: FedsysCLI) -> None:
    """Issue 75: ``init-from`` a site's private key in the deployment directory, which the
    server's data directory holds, is refused naming the key and the deployment."""
    key = plain.key_file(0)
    assert key.exists()
    cfg = tmp_path / "into-deployment.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "into-deployment", "output-dir": str(tmp_path / "runs"), "strategy": "fedavg",
        "dataset": "synthetic", "model": "mlp", "num-clients": NODES,
        "clients-per-round": NODES, "num-server-rounds": 1, "init-from": str(key)}))
    res = fedsys_cli.run("deploy", "run", str(cfg), "--dir", str(plain.root), "--timeout", "300")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    says = f"config key 'init-from': '{key}' is inside the deployment ({plain.root}"
    assert says in res.stdout, res.stdout[-3000:]
    assert not (tmp_path / "runs" / "into-deployment").exists()


def test_flowers_template_in_a_deployment(plain: LocalDeployment) -> None:
    """Flower's app template under IMA over FedCDA, 2 rounds on the 2 SuperNodes: every
    reply used, federated accuracy rising, no ERROR, no traceback, no refused reply."""
    # small: in a deployment every message starts a ClientApp process (torch, the data)
    out = plain.flwr_cli.run(APP, {"strategy": "fedcda+ima", "num-server-rounds": 2}, timeout=400)
    check(out, "fedcda+ima", nodes=NODES, rounds_run=2)


def test_deploy_run_to_an_unreachable_superlink_says_nothing_ran(tmp_path: Path,
                                                                 fedsys_cli: FedsysCLI) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"name": "nowhere", "output-dir": str(tmp_path / "runs"),
                                   "dataset": "synthetic", "model": "mlp", "num-server-rounds": 1}))
    res = fedsys_cli.run("deploy", "run", str(cfg), "--superlink", f"127.0.0.1:{free_port()}",
                         "--insecure", "--dir", str(tmp_path / "d"), "--timeout", "120")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "before a run started" in res.stderr and "nothing ran" in res.stderr, res.stderr
    assert "resume" not in res.stderr and "results:" not in res.stdout

