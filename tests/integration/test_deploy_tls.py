"""Deployment with TLS and node authentication, proven on real processes on 127.0.0.1.

One module-scoped deployment, started and stopped as an operator does it:
``fedsys deploy up --tls --auth`` (the topology of ``docker-compose.yml``: a SuperLink
over HTTPS with SuperNode authentication, its SuperExec running the ServerApp, and
three SuperNodes with registered keys, each with its own SuperExec running the
ClientApp) and ``fedsys deploy down``.  On it:

* the reference run, FedAvg then FedCross on Fashion-MNIST: the ServerApp side
  (SuperExec and its ``flwr-serverapp``) is killed in FedCross's round 2, restarted,
  and ``fedsys deploy run --set resume=true`` finishes the run.  Both strategies end
  bit-identical to the same config in Flower's simulation engine, uninterrupted
  (node ids do not matter): FedAvg, which ran through, shows deployment equals
  simulation; FedCross, which was resumed, shows the resume is exact.  The run asks
  each node for its partition once for both strategies (:class:`strategies.nodes.Known`);
* a SuperNode with an unregistered key is refused, and clients without the CA
  certificate cannot connect.

Sites that die mid-round and mid-hop are tests/integration/test_deploy_faults.py, on a
deployment of their own (:mod:`tests.integration.tls_deployment`), so that the two run side
by side.

Deployment costs seconds per message (the SuperNode polls every 3 s and each message
starts a ClientApp process), so the runs are one or two rounds of a tiny MLP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
import yaml

from fedsys import checkpoint, metrics
from launch.deploy import (
    CONNECTION,
    SERVER_EXEC,
    SUPERLINK,
    LocalDeployment,
    _alive,
    _bin,
    _signal_all,
    descendants,
    free_port,
    node_name,
    started_run,
)

if TYPE_CHECKING:
    from conftest import FedsysCLI

from tests.integration.tls_deployment import (  # noqa: F401  (tls_dep: the fixture dep)
    NODES,
    RESUME_STRATEGY,
    ROOT,
    STRATEGIES,
    _count,
    _wait_for,
    run_config,
    tls_dep,
)

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


@dataclass
class Reference:
    """The reference run (see the module docstring) and what its kill left behind."""

    dir: Path
    log: str                 #: ``fedsys deploy run --set resume=true`` output
    killed_at: int           #: FedCross's checkpointed round when the server side died
    serverapps: list[int]    #: the ``flwr-serverapp`` processes the kill found
    stop: str                #: ``flwr stop`` of the dead run: exit status and output
    queries: list[int]       #: query messages each node received, per submission


def _queries(dep: LocalDeployment) -> list[int]:
    return [_count(dep.log_file(node_name(i)), "Receiving: query message") for i in range(NODES)]


@pytest.fixture(scope="module")
def reference(dep: LocalDeployment, tmp_path_factory: pytest.TempPathFactory,
              module_fedsys_cli: FedsysCLI) -> Reference:
    """FedAvg then FedCross on Fashion-MNIST; the server side killed in FedCross's round
    2 and restarted, the run resubmitted with ``resume=true``."""
    out = tmp_path_factory.mktemp("runs")
    cfg = run_config(out, "reference", dataset="fashion-mnist", **{
        "local-steps": 30, "test-subset": 2000})
    q0 = _queries(dep)
    first = dep.submit(ROOT, cfg, out / "first.log")
    ckpt = out / "reference" / RESUME_STRATEGY / "checkpoint.pt"
    try:
        _wait_for(ckpt.exists, 900, f"the round-1 checkpoint of {RESUME_STRATEGY}", first)
        time.sleep(1.0)  # round 2 is under way
        serverapps = [p for p in descendants(dep.components[SERVER_EXEC].pid)
                      if b"flwr-serverapp" in Path(f"/proc/{p}/cmdline").read_bytes()]
        dep.kill(SERVER_EXEC)
    finally:
        _signal_all(descendants(first.pid), signal.SIGKILL)
        first.wait()
    killed_at = checkpoint.load(ckpt)["round"]
    q1 = _queries(dep)
    run_id = started_run((out / "first.log").read_text())
    assert run_id is not None
    stop = dep.flwr("stop", str(run_id), CONNECTION)  # the dead run: nodes stop working on it
    dep.start(SERVER_EXEC)
    yaml_file = out / "reference.yaml"
    yaml_file.write_text(yaml.safe_dump(cfg))
    res = module_fedsys_cli.run("deploy", "run", str(yaml_file), "--set", "resume=true",
                     "--dir", str(dep.root), "--timeout", "900", timeout=1000)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (out / "reference" / "flwr.log").write_text(res.stdout)
    return Reference(out / "reference", res.stdout, killed_at, serverapps,
                     f"exit {stop.returncode}: {stop.stdout}{stop.stderr}",
                     [b - a for a, b in zip(q0, q1, strict=True)]
                     + [b - a for a, b in zip(q1, _queries(dep), strict=True)])


@pytest.fixture(scope="module")
def simulated(reference: Reference, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference config in Flower's simulation engine, uninterrupted."""
    out = tmp_path_factory.mktemp("sim")
    sim = subprocess.run(
        [sys.executable, "-m", "launch", "run", str(reference.dir / "config.yaml"),
         "--set", "name=sim", "--set", f"output-dir={out}", "--set", "resume=false"],
        cwd=ROOT, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}, capture_output=True,
        text=True, timeout=600, check=False)
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    return out / "sim"


def test_deployment_uses_tls_and_registered_nodes(dep: LocalDeployment) -> None:
    assert "Uvicorn running on https://" in dep.log_file("superlink").read_text()
    nodes = dep.nodes()
    assert len(nodes) == NODES and all(n["status"] == "online" for n in nodes)
    registered = dep.root / "keys"
    assert sorted(p.name for p in registered.glob("*.pub")) == [
        f"{node_name(i)}.pub" for i in range(NODES)]
    # the nodes (and the ClientApps they start) leave the cores to the SuperLink first
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for name in dep.names():
        want = mine if name in (SUPERLINK, SERVER_EXEC) else min(mine + dep.node_nice, 19)
        assert os.getpriority(os.PRIO_PROCESS, dep.components[name].pid) == want, name
        group = Path(f"/proc/{dep.components[name].pid}/autogroup")
        if group.exists():  # sessions share the CPU first: the niceness must be the group's
            want_group = 0 if name in (SUPERLINK, SERVER_EXEC) else dep.node_nice
            assert group.read_text().split()[-1] == str(want_group), (name, group.read_text())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_run_completes_over_tls_with_node_auth(reference: Reference, strategy: str) -> None:
    recs = metrics.read_jsonl(reference.dir / strategy / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2], reference.log[-3000:]
    assert all(r["clients-ok"] == NODES and r["clients-rejected"] == 0 for r in recs[1:])
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]
    if strategy == "fedavg":  # Fashion-MNIST, two rounds: it learned something
        assert recs[-1]["accuracy"] > 0.5 > recs[0]["accuracy"], recs
    assert (reference.dir / strategy / "model.pt").exists()
    assert "final acc %" in reference.log and strategy in reference.log  # the results table


def test_one_query_per_node_and_run_whatever_the_strategies(reference: Reference) -> None:
    """Both strategies of the first submission share one QUERY round; the resubmitted
    run (a new ServerApp, FedAvg already done) asks once again."""
    assert reference.queries == [1] * NODES + [1] * NODES, reference.queries


def test_deployment_equals_simulation(reference: Reference, simulated: Path) -> None:
    """FedAvg ran through: the deployment ends where Flower's simulation engine ends
    (random node ids, Ray), bit for bit."""
    dep_model = torch.load(reference.dir / "fedavg" / "model.pt")
    sim_model = torch.load(simulated / "fedavg" / "model.pt")
    assert all(torch.equal(dep_model[k], sim_model[k]) for k in dep_model)


def test_status_shows_the_components_nodes_and_runs(
    dep: LocalDeployment, reference: Reference, module_fedsys_cli: FedsysCLI
) -> None:
    status = module_fedsys_cli.run("deploy", "status", "--dir", str(dep.root))
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("running") >= 2 * NODES + 2 and "online" in status.stdout
    flat = status.stdout.replace("\n", "")
    assert "finished:completed" in flat and "finished:stopped" in flat  # flwr ls


def _start_node(dep: LocalDeployment, home: Path, key: Path | None, tls_args: list[str]
                ) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    auth = ["--auth-supernode-private-key", str(key)] if key else []
    args = [_bin("flower-supernode"), *tls_args, *auth, "--superlink", dep.address,
            "--isolation", "process", "--port", str(free_port()), "--max-retries", "2",
            "--node-config", f"partition-id=0 num-partitions={NODES}"]
    with (home / "node.log").open("wb") as log:
        return subprocess.Popen(args, cwd=home, env={**dep.env, "FLWR_HOME": str(home)},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_exit(p: subprocess.Popen[bytes], timeout: float = 90.0) -> int | None:
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_all(descendants(p.pid), signal.SIGKILL)
        p.wait()
        return None


def test_unregistered_key_and_missing_ca_are_refused(dep: LocalDeployment,
                                                     tmp_path: Path) -> None:
    before = {n["node-id"] for n in dep.nodes()}
    key = tmp_path / "intruder"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(key)],
                   check=True)
    # the right CA, a key nobody registered: the SuperLink refuses to activate it
    p = _start_node(dep, tmp_path / "unregistered", key, ["--root-certificates",
                                                         str(dep.ca_cert)])
    rc = _wait_exit(p)
    log = (tmp_path / "unregistered" / "node.log").read_text()
    assert rc not in (0, None), log[-2000:]
    assert "Failed to activate SuperNode" in log and "Exit Code: 305" in log, log[-2000:]
    # a registered key but no CA certificate: the TLS handshake fails
    p = _start_node(dep, tmp_path / "no-ca", dep.key_file(0), [])
    rc = _wait_exit(p)
    log = (tmp_path / "no-ca" / "node.log").read_text()
    assert rc not in (0, None), log[-2000:]
    assert "CERTIFICATE_VERIFY_FAILED" in log, log[-2000:]
    # plain HTTP against the HTTPS SuperLink does not get through either
    p = _start_node(dep, tmp_path / "plain", dep.key_file(0), ["--insecure"])
    assert _wait_exit(p) not in (0, None)
    # the flwr CLI without the CA certificate cannot reach the Control API
    home = tmp_path / "cli-no-ca"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "{dep.address}"\n')
    cli = subprocess.run([_bin("flwr"), "ls", "x"], cwd=home, capture_output=True, text=True,
                         env={**dep.env, "FLWR_HOME": str(home)}, timeout=120, check=False)
    assert cli.returncode != 0 or "CERTIFICATE_VERIFY_FAILED" in cli.stdout + cli.stderr
    assert {n["node-id"] for n in dep.nodes()} == before


def test_serverapp_killed_and_restarted_resumes_to_the_same_weights(
    reference: Reference, simulated: Path
) -> None:
    """The server side (SuperExec and its ``flwr-serverapp``) was killed in round 2 of
    the last strategy and restarted, the run resubmitted with ``resume=true``: its final
    model equals the uninterrupted run's (simulation, which FedAvg shows equal to the
    deployment) bit for bit."""
    assert reference.serverapps, "no flwr-serverapp process under the server SuperExec"
    assert not [p for p in reference.serverapps if _alive(p)]
    assert reference.killed_at == 1
    assert reference.stop.startswith("exit 0"), reference.stop
    assert f"[{RESUME_STRATEGY}] resuming after round 1" in reference.log, reference.log[-3000:]
    recs = metrics.read_jsonl(reference.dir / RESUME_STRATEGY / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    ref = torch.load(simulated / RESUME_STRATEGY / "model.pt")
    got = torch.load(reference.dir / RESUME_STRATEGY / "model.pt")
    assert ref.keys() == got.keys()
    ref_recs = metrics.read_jsonl(simulated / RESUME_STRATEGY / "metrics.jsonl")
    assert all(torch.equal(ref[k], got[k]) for k in ref), (
        f"resumed run differs from the uninterrupted one\nuninterrupted: {ref_recs}\n"
        f"resumed: {recs}\nresumed run:\n{reference.log[-3000:]}")
    assert recs[-1]["accuracy"] == ref_recs[-1]["accuracy"]


