"""The threat model's rows about tasks and ownership, attacked on a real deployment.

One module-scoped deployment (``fedsys deploy up --nodes 2 --tls --auth``, real SuperLink,
proxy, SuperExecs and SuperNodes on 127.0.0.1).  On it, the attacks of issue 75:

* a site's local user (another uid) scans every process during a run for a task token:
  none is on a command line or readable environment, and what it can read takes no task;
* a token without its task's key is refused by the Runtime API (the SuperExec that
  acquired the task is the only one that can make the key), and a task taken and dropped
  without a reply costs one message: the node serves the next run;
* a registered site pulls, confirms and answers only what was handed to it, and a node's
  bound signature is good once.

Each defence is a guarded Flower patch (fedsys_launch/flower_patches.py); removing it
makes the matching test fail (checked by hand with ``FEDSYS_FLOWER_PATCHES=<name>``,
recorded in docs/deployment.md §12).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.proto.fleet_pb2 import PullMessagesRequest, PushMessagesRequest
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullTaskInputRequest,
    PushTaskOutputRequest,
)
from flwr.supercore.auth import derive_auth_secret
from flwr.supercore.constant import TaskType
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

from fedsys_launch.deploy.flwr_cli import CONNECTION
from fedsys_launch.deploy.local_deployment import (
    STATE_FILE,
    LocalDeployment,
    node_exec_name,
    node_name,
)
from fedsys_launch.process.supervision import alive
from fedsys_launch.runtime_auth import sign_task_call, task_key

if TYPE_CHECKING:
    from conftest import FedsysCLI

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]
NODES = 2
NOBODY = 65534


def run_config(out: Path, name: str, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "name": name, "output-dir": str(out), "strategy": "fedavg", "dataset": "synthetic",
        "model": "mlp", "partition": "iid", "num-clients": NODES, "clients-per-round": NODES,
        "min-available-clients": NODES, "num-server-rounds": 1, "local-steps": 5,
        "round-timeout": 240.0, "node-wait-timeout": 240.0}
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="module", name="dep")
def redteam_dep(tmp_path_factory: pytest.TempPathFactory,
                module_fedsys_cli: FedsysCLI) -> Iterator[LocalDeployment]:
    root = tmp_path_factory.mktemp("redteam") / "deploy"
    up = module_fedsys_cli.run("deploy", "up", "--nodes", str(NODES), "--tls", "--auth",
                               "--dir", str(root), "--roots", str(root.parent / "runs"))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        d = LocalDeployment.load(root)
        pids = d.all_pids()
        yield d
    finally:
        if (root / STATE_FILE).exists():
            pids = sorted(set(pids) | set(LocalDeployment.load(root).all_pids()))
        down = module_fedsys_cli.run("deploy", "down", "--dir", str(root))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [p for p in pids if alive(p)], "processes left running after down"


def _runtime(dep: LocalDeployment, i: int, *interceptors: Any) -> RuntimeHttpClient:
    """A client of site ``i``'s Runtime API (plain HTTP on its loopback port)."""
    return RuntimeHttpClient.from_server_address(
        f"127.0.0.1:{dep.node_ports[i]}", insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                      *interceptors])


def _status(call: Callable[[], Any]) -> int:
    """The HTTP status a Runtime or Fleet call ends with (200 when it returns)."""
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


def _node_id(dep: LocalDeployment, i: int) -> int:
    found = re.findall(r"SuperNode ID: (\d+)", dep.log_file(node_name(i)).read_text())
    assert found, f"no node id in {node_name(i)}'s log"
    return int(found[-1])


def _fleet(dep: LocalDeployment, i: int) -> FleetHttpClient:
    """A Fleet API client that signs as site ``i`` (its key, as a plain Flower SuperNode)."""
    key = load_ssh_private_key(dep.key_file(i).read_bytes(), password=None)
    return FleetHttpClient.from_server_address(
        dep.address, insecure=False, root_certificates=str(dep.root / "certs" / "ca.crt"),
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                      NodeAuthHttpInterceptor(key, key.public_key())])  # type: ignore[arg-type]


def _stopped(dep: LocalDeployment, name: str) -> Any:
    """SIGSTOP component ``name`` until the block ends (SIGCONT)."""
    import contextlib

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        pid = dep.components[name].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
    return held()


def _until(get: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = get()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def _submit(dep: LocalDeployment, cfg: dict[str, object], log: Path
            ) -> Callable[[float], str]:
    """Submit ``cfg`` in the background; a function that waits for it and returns its log."""
    proc = dep.flwr_cli.submit(ROOT, cfg, log)

    def wait(timeout: float) -> str:
        proc.wait(timeout=timeout)
        return log.read_text()
    return wait


def _ok_clients(log: str) -> list[tuple[str, str]]:
    return re.findall(r"clients (\d+) ok, (\d+) rejected", log)


def test_a_token_alone_takes_nothing_and_a_dropped_task_is_given_back(
        dep: LocalDeployment, tmp_path: Path) -> None:
    """Items 1 and 2 of issue 75: a task's token without the key its SuperExec derives is
    refused by the Runtime API (Flower 1.42: 200 and the run's context); a task taken and
    finished without a reply gets an error reply at once (Flower: the SuperNode waited for
    that reply for ever, deaf to every later run), and the next run completes with both
    sites."""
    secret = dep.site_secret(0).read_bytes()
    acquire = _runtime(dep, 0, SuperExecAuthHttpInterceptor(
        master_secret=secret, protected_methods={"/flwr.proto.Runtime/AcquireTask"}))
    with _stopped(dep, node_exec_name(0)):  # its SuperExec would take the task first
        wait = _submit(dep, run_config(dep.root.parent / "runs", "dropped"), tmp_path / "dropped.log")
        got = _until(lambda: acquire.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])).token, 240,
                     "task on site 0")
        token: str = got
        alone = _runtime(dep, 0, RuntimeTokenHttpInterceptor(token))
        assert _status(lambda: alone.PullTaskInput(PullTaskInputRequest())) == 401
        wrong = _signed(dep, token, b"not the site's key")
        assert _status(lambda: wrong.PullTaskInput(PullTaskInputRequest())) == 401
        keyed = _signed(dep, token, task_key(derive_auth_secret(secret), token))
        assert _status(lambda: keyed.PullTaskInput(PullTaskInputRequest())) == 200
        # dropped: finished without a reply
        keyed.PushTaskOutput(PushTaskOutputRequest(sub_status="failed", details="dropped"))
    out = wait(400)
    assert "round 1/1" in out, out[-2000:]
    node_log = dep.log_file(node_name(0)).read_text()
    assert "its task ended without a reply: error reply sent" in node_log, node_log[-2000:]
    # the node serves the next run: both sites' replies accepted
    log = dep.flwr_cli.run(ROOT, run_config(dep.root.parent / "runs", "after"), timeout=400)
    assert _ok_clients(log) == [("2", "0")], log[-3000:]


def _signed(dep: LocalDeployment, token: str, key: bytes) -> RuntimeHttpClient:
    """A Runtime client that sends ``token`` and signs each call with ``key``."""

    class Sign:
        def intercept(self, context: Any, call_next: Callable[[Any], Any]) -> Any:
            body = context.message.SerializeToString(deterministic=True)
            context.request.headers.update(sign_task_call(key, context.request.url.path, body))
            return call_next(context)

    return _runtime(dep, 0, RuntimeTokenHttpInterceptor(token), Sign())


SCAN = r"""
import os, re, sys, time, json
deadline, stop = time.time() + float(sys.argv[1]), sys.argv[2]
seen, tokens, environs = set(), set(), 0
while time.time() < deadline and not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "flwr-clientapp" in cmd or "flwr-serverapp" in cmd:
            seen.add(cmd.strip())
        for m in re.finditer(r"--token[ =](\S+)", cmd):
            if m.group(1) != "***":
                tokens.add(m.group(1))
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if "flwr" in cmd or "fedsys" in cmd:
            environs += 1
        for m in re.finditer(rb"TOKEN=([^\0]+)", env):
            tokens.add(m.group(1).decode(errors="replace"))
    time.sleep(0.05)
print(json.dumps({"apps": sorted(seen), "tokens": sorted(tokens), "environs": environs}))
"""


def test_another_user_finds_no_token_during_a_run(dep: LocalDeployment, tmp_path: Path) -> None:
    """Item 1 of issue 75: during a run, a process of another uid reads every
    ``/proc/PID/cmdline`` it can (Flower 1.42: ``--token`` on every app process's command
    line, which fedsys's fork server also copied into the process title) and every
    environment it can: it sees the app processes, and no token."""
    import json

    wait = _submit(dep, run_config(dep.root.parent / "runs", "scanned"), tmp_path / "scanned.log")
    # as another uid where the test may switch (CI is root), with a Python that uid can run
    # (the venv's may lie under a home it cannot enter); else as this uid, titles only
    system_python = "/usr/bin/python3"
    as_other = os.getuid() == 0 and os.path.exists(system_python)
    stop = Path(tempfile.gettempdir()) / f"fedsys-scan-stop-{os.getpid()}"  # it can see
    stop.unlink(missing_ok=True)
    scan = subprocess.Popen(
        [system_python if as_other else sys.executable, "-c", SCAN, "400", str(stop)],
        stdout=subprocess.PIPE, text=True, cwd="/", user=NOBODY if as_other else None)
    try:
        log = wait(400)  # the scan runs as long as the run does
    finally:
        stop.touch()
        out, _ = scan.communicate(timeout=60)
        stop.unlink(missing_ok=True)
    assert scan.returncode == 0
    found = json.loads(out)
    assert found["apps"], "the scan saw no app process: it proves nothing"
    assert all("--token ***" in a for a in found["apps"]), found["apps"]
    assert found["tokens"] == [], found
    if as_other:  # another uid reads no environment of the deployment's processes
        assert found["environs"] == 0, found
    assert _ok_clients(log) == [("2", "0")], log[-3000:]


def test_a_registered_site_reaches_only_what_was_handed_to_it(
        dep: LocalDeployment, tmp_path: Path) -> None:
    """Item 6 of issue 75: with site 1's registered key, another site's message cannot be
    pulled, confirmed or answered (Flower 1.42: pull-object and confirm served any object
    or message of a running run, and push-messages took a reply naming any node); the
    owner still pulls it."""
    n0, n1 = _node_id(dep, 0), _node_id(dep, 1)
    owner, other = _fleet(dep, 0), _fleet(dep, 1)
    pulled: list[Any] = []

    def pull() -> bool:
        res = owner.PullMessages(PullMessagesRequest(node=Node(node_id=n0)))
        pulled.extend(zip(res.messages_list, res.message_object_trees, strict=True))
        return bool(pulled)

    with _stopped(dep, node_name(0)):  # site 0's own SuperNode would take the message first
        wait = _submit(dep, run_config(dep.root.parent / "runs", "owned", **{"round-timeout": 20.0}),
                       tmp_path / "owned.log")
        _until(pull, 120, "message for site 0")
    msg, tree = pulled[0]
    run, mid = msg.metadata.run_id, msg.metadata.message_id
    # the message's own object (its metadata names site 0); objects of its content may be
    # site 1's too (the same query or model goes to every site) and are served to both
    own = tree.object_id
    node1 = Node(node_id=n1)
    assert _status(lambda: other.PullObject(PullObjectRequest(node=node1, run_id=run,
                                                              object_id=own))) == 403
    assert _status(lambda: other.ConfirmMessageReceived(ConfirmMessageReceivedRequest(
        node=node1, run_id=run, message_object_id=mid))) == 403
    for src in (n0, n1):
        push = PushMessagesRequest(node=node1, messages_list=[_reply_to(msg, src)],
                                   message_object_trees=[tree])
        assert _status(functools.partial(other.PushMessages, push)) == 403
    assert _status(lambda: owner.PullObject(PullObjectRequest(node=Node(node_id=n0), run_id=run,
                                                              object_id=own))) == 200
    dep.flwr_cli.call("stop", str(run), CONNECTION)
    wait(300)


def _reply_to(msg: Any, src: int) -> Any:
    """A reply to the protobuf message ``msg`` that names node ``src`` as its sender."""
    reply = type(msg)()
    reply.CopyFrom(msg)
    reply.metadata.reply_to_message_id = msg.metadata.message_id
    reply.metadata.src_node_id, reply.metadata.dst_node_id = src, msg.metadata.src_node_id
    return reply
