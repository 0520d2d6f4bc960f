"""`fedsys deploy up / status / down` as first tried, without TLS (the default), on
127.0.0.1, one deployment of two SuperNodes for the module (started and stopped by the
CLI): a SuperNode comes online over plain HTTP, the flwr CLI reaches the Control API, a
second `up` is refused, a run that fails on the server side makes `fedsys deploy run` fail
(``flwr run --stream`` itself exits 0 however the run ended), Flower's app template
(``flower_template/``, see test_flower_template.py) trains under IMA over FedCDA on it, and
`down` leaves nothing running; a SuperLink nobody listens on fails `deploy run` without a
resume hint.

Runs (`fedsys deploy run`, Fashion-MNIST, the results table, `status` after them) are
proven over TLS with node authentication in tests/integration/test_deploy_tls.py, on one
deployment that the same `fedsys deploy up` / `down` start and stop; the two modes differ
only in the flags `fedsys_launch.deploy.LocalDeployment.command` gives each process
(tests/unit/test_deploy_cli.py).  The template shares this module's deployment (each
deployment costs about 40 s of CPU to start and stop, docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from fedsys_launch.deploy import STATE_FILE, LocalDeployment, _alive, free_port
from tests.integration.test_flower_template import APP, check

if TYPE_CHECKING:
    from conftest import FedsysCLI

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

NODES = 2


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory,
          module_fedsys_cli: FedsysCLI) -> Iterator[LocalDeployment]:
    """``fedsys deploy up --nodes 2`` (insecure), and ``down`` after the module: nothing of
    it left running."""
    root = tmp_path_factory.mktemp("plain") / "deploy"
    up = module_fedsys_cli.run("deploy", "up", "--nodes", str(NODES), "--dir", str(root),
                               "--roots", str(tmp_path_factory.getbasetemp()))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"(insecure), {NODES} SuperNodes" in up.stdout, up.stdout
        dep = LocalDeployment.load(root)
        pids = dep.all_pids()
        yield dep
    finally:
        if (root / STATE_FILE).exists():
            pids = sorted(set(pids) | set(LocalDeployment.load(root).all_pids()))
        down = module_fedsys_cli.run("deploy", "down", "--dir", str(root))
    assert down.returncode == 0 and "nothing of" in down.stdout, down.stdout + down.stderr
    assert not [p for p in pids if _alive(p)], "processes left running after down"


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


def test_flowers_template_in_a_deployment(plain: LocalDeployment) -> None:
    """Flower's app template under IMA over FedCDA, 2 rounds on the 2 SuperNodes: every
    reply used, federated accuracy rising, no ERROR, no traceback, no refused reply."""
    # small: in a deployment every message starts a ClientApp process (torch, the data)
    out = plain.flwr_run(APP, {"strategy": "fedcda+ima", "num-server-rounds": 2}, timeout=400)
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

