"""`fedsys deploy up / status / down` as first tried, without TLS (the default), on
127.0.0.1: a SuperNode comes online over plain HTTP, the flwr CLI reaches the Control
API, a second `up` is refused, a run that fails on the server side makes `fedsys deploy
run` fail (``flwr run --stream`` itself exits 0 however the run ended), and `down` leaves
nothing running; a SuperLink nobody listens on fails `deploy run` without a resume hint.

Runs (`fedsys deploy run`, Fashion-MNIST, the results table, `status` after them) are
proven over TLS with node authentication in tests/integration/test_deploy_tls.py, on one
deployment that the same `fedsys deploy up` / `down` start and stop; the two modes differ
only in the flags `launch.deploy.LocalDeployment.command` gives each process
(tests/unit/test_deploy_cli.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from launch.deploy import LocalDeployment, _alive, free_port

if TYPE_CHECKING:
    from conftest import FedsysCLI

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


def test_deploy_cli_up_status_down_without_tls(tmp_path: Path,
                                                fedsys_cli: FedsysCLI) -> None:
    d = str(tmp_path / "deploy")
    pids: list[int] = []
    try:
        up = fedsys_cli.run("deploy", "up", "--nodes", "1", "--dir", d)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "(insecure), 1 SuperNodes" in up.stdout, up.stdout
        dep = LocalDeployment.load(Path(d))
        assert not dep.tls and not dep.auth
        again = fedsys_cli.run("deploy", "up", "--dir", d)
        assert again.returncode == 2 and "a deployment is running" in again.stderr
        pids = dep.all_pids()
        assert len(pids) >= 4  # SuperLink, server SuperExec, a SuperNode and its SuperExec
        assert "--insecure" in Path(f"/proc/{dep.components['superlink'].pid}/cmdline") \
            .read_bytes().decode().split("\0")
        status = fedsys_cli.run("deploy", "status", "--dir", d)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("running") >= 4 and "online" in status.stdout, status.stdout
        # the ServerApp waits 1 s for a second node that never comes, and raises
        cfg = tmp_path / "two-nodes.yaml"
        cfg.write_text(yaml.safe_dump({
            "name": "two-nodes", "output-dir": str(tmp_path / "runs"), "strategy": "fedavg",
            "dataset": "synthetic", "model": "mlp", "num-clients": 2, "clients-per-round": 2,
            "min-available-clients": 2, "node-wait-timeout": 1, "num-server-rounds": 1}))
        failed = fedsys_cli.run("deploy", "run", str(cfg), "--dir", d, "--timeout", "300")
        assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
        assert "ended finished:failed (flwr ls)" in failed.stderr, failed.stderr
        assert "submit again with --set resume=true" in failed.stderr
        assert "results:" not in failed.stdout, failed.stdout[-2000:]
    finally:
        down = fedsys_cli.run("deploy", "down", "--dir", d)
    assert down.returncode == 0 and "nothing of" in down.stdout, down.stdout + down.stderr
    assert not [p for p in pids if _alive(p)], "processes left running after down"


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
