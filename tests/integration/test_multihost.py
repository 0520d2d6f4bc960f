"""A federation across addresses, set up from kits as an operator and its sites do it.

The server and each site live in a network namespace of their own (``netns.Netns``),
on 198.51.100.0/24 with no route out; ``fl.example.org`` resolves to the server's
address in every namespace.  The operator makes a server kit for that name and address
and starts its ``start.sh`` in the server's namespace (SuperLink on that namespace's
loopback, the proxy on 198.51.100.1:9093, the server's SuperExec); each site makes its
key pair in its own namespace, the operator registers the ``.pub`` (``add-site``), and
the site starts the kit it got back (``kit/start.sh``).  On it:

* a run of two sites ends bit-identical to the same config in simulation (fedsys's
  in-process engine one client at a time, which tests/integration/test_inprocess_engine.py
  holds bit-identical to Flower's);
* from a site's namespace only the sites' port answers (the SuperLink's port, its
  Control API, anything else listening in the server's namespace: refused), and the
  proxy answers the Fleet API only;
* a site whose link is cut in the middle of a round: the round aggregates the other
  after ``round-timeout``, as docs/deployment.md §8 says, and the site is back when its
  link is;
* a third site with its own data, added while the federation is up, joins the next run
  (with the site whose link was cut), and ``fedsys deploy status --kit`` shows each site
  online, last seen, and the run it is in;
* the red-team rows against the kits: a site's local user finds no task token, and a
  registered site, from its own namespace, reaches only what was handed to it;
* a removed site's key is refused by the SuperLink.

One federation for the module (about N minutes on 2 cores).  Needs root (``ip netns``);
where namespaces cannot be made it skips, saying why (CI runs as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import torch
import yaml

from fedsys import metrics
from fedsys_launch.deploy.flwr_cli import CONNECTION, console_script
from fedsys_launch.process.flower_env import FLWR_ENV
from tests.integration.netns import Netns, unavailable
from tests.integration.test_deploy_redteam import NOBODY, SCAN

pytestmark = [pytest.mark.slow, pytest.mark.deploy, pytest.mark.multihost]

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "fl.example.org"
SITES_PORT, LINK_PORT = 9093, 9091
ROUND_TIMEOUT = 300.0
CUT_ROUND_TIMEOUT = 45.0
ENV = {**os.environ, **FLWR_ENV, "PYTHON": sys.executable}
SYSTEM_PYTHON = "/usr/bin/python3"  # a Python another uid can run (the venv may be in a home)


@dataclass
class Federation:
    """The namespaces, the server kit and the sites started from their kits."""

    net: Netns
    holder: Path
    kit: Path
    runs: Path
    logs: list[IO[Any]] = field(default_factory=list)
    sites: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    server: subprocess.Popen[Any] | None = None

    def fedsys(self, where: str, *args: str, timeout: float = 900
               ) -> subprocess.CompletedProcess[str]:
        """``fedsys ARGS`` in namespace ``where``, as its user types it."""
        return self.net.run(where, [sys.executable, "-m", "fedsys_launch", *args], env=ENV,
                            timeout=timeout, cwd=self.holder)

    def flwr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``flwr ARGS`` with the kit's connection, in the server's namespace."""
        return self.net.run("srv", [console_script("flwr"), *args], timeout=120,
                            env={**ENV, "FLWR_HOME": str(self.kit / "cli")})

    def nodes(self) -> dict[int, str]:
        """Node id -> Flower's status of every registered node."""
        import json

        proc = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        try:
            return {int(n["node-id"]): n["status"] for n in json.loads(proc.stdout)["nodes"]}
        except (ValueError, KeyError) as exc:
            raise AssertionError(f"flwr supernode list: {proc.stdout}{proc.stderr}") from exc

    def wait(self, cond: Any, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if self.server is not None and self.server.poll() is not None:
                raise AssertionError(f"the server's start.sh exited before {what}:\n"
                                     + self.log("server")[-3000:])
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(1.0)

    def log(self, name: str) -> str:
        path = self.holder / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, ns: str, name: str, argv: list[str]) -> subprocess.Popen[Any]:
        (self.holder / "logs").mkdir(exist_ok=True)
        fh = (self.holder / "logs" / f"{name}.log").open("ab")
        self.logs.append(fh)
        return self.net.start(ns, argv, fh, env=ENV)

    def site_dir(self, name: str) -> Path:
        return self.holder / name

    def add_site(self, name: str, host: int, *placement: str) -> int:
        """Site ``name`` at 198.51.100.HOST: key pair made there, registered by the
        operator, its kit copied to the site and started; its node id."""
        self.net.add(name, host)
        site = self.site_dir(name)
        made = self.fedsys(name, "deploy", "site-key", name, "--out", str(site))
        assert made.returncode == 0, made.stdout + made.stderr
        added = self.fedsys("srv", "deploy", "add-site", str(site / "keys" / f"{name}.pub"),
                            "--kit", str(self.kit), *placement)
        assert added.returncode == 0, added.stdout + added.stderr
        shutil.copytree(self.kit / "sites" / name, site / "kit")  # sent to the site
        self.sites[name] = self.start(name, name, ["bash", str(site / "kit" / "start.sh")])
        import json

        return int(json.loads((site / "kit" / "site.json").read_text())["node-id"])

    def online(self, n: int, timeout: float = 180) -> None:
        self.wait(lambda: sum(s == "online" for s in self.nodes().values()) >= n, timeout,
                  f"{n} sites online")

    def submit(self, name: str, n: int, **extra: object) -> subprocess.Popen[str]:
        """``fedsys deploy run`` of a FedAvg config over ``n`` sites, in the server's
        namespace, in the background."""
        cfg = run_config(self.runs, name, n, **extra)
        path = self.runs / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        argv = self.net.argv("srv", [
            sys.executable, "-m", "fedsys_launch", "deploy", "run", str(path),
            "--superlink", f"127.0.0.1:{LINK_PORT}",
            "--root-certificates", str(self.kit / "certs" / "ca.crt"),
            "--dir", str(self.holder / "operator"), "--timeout", "900"])
        return subprocess.Popen(argv, env=ENV, cwd=self.holder, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)


def run_config(out: Path, name: str, n: int, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "name": name, "output-dir": str(out), "strategy": "fedavg", "dataset": "synthetic",
        "model": "mlp", "partition": "iid", "num-clients": n, "clients-per-round": n,
        "min-available-clients": n, "num-server-rounds": 2, "local-steps": 5,
        "round-timeout": ROUND_TIMEOUT, "node-wait-timeout": 300.0}
    cfg.update(extra)
    return cfg


def finished(proc: subprocess.Popen[str], timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def fed() -> Iterator[Federation]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    holder = Path(tempfile.mkdtemp(prefix="fedsys-multihost-"))
    net = Netns({SERVER_NAME: "198.51.100.1"})
    f = Federation(net, holder, holder / "server-kit", holder / "runs")
    f.runs.mkdir()
    try:
        net.add("srv", 1)
        made = f.fedsys("srv", "deploy", "server-kit", "--name", SERVER_NAME,
                        "--address", "198.51.100.1", "--out", str(f.kit),
                        "--roots", str(f.runs))
        assert made.returncode == 0, made.stdout + made.stderr
        f.server = f.start("srv", "server", ["bash", str(f.kit / "start.sh")])
        f.wait(lambda: '"success": true' in f.flwr("supernode", "list", CONNECTION,
                                                   "--format", "json").stdout,
               120, "the SuperLink to answer in the server's namespace")
        for i in range(2):
            f.add_site(f"site{i}", 10 + i, "--partition-id", str(i), "--num-partitions", "2")
        f.online(2)
        yield f
    finally:
        net.remove()
        for fh in f.logs:
            fh.close()
        left = net.leftovers()
        shutil.rmtree(holder, ignore_errors=True)
    assert not left, f"namespaces left behind: {left}"


@pytest.fixture(scope="module")
def first_run(fed: Federation) -> Path:
    out = finished(fed.submit("across", 2))
    assert "final acc %" in out, out[-3000:]
    return fed.runs / "across"


def test_a_run_across_addresses_equals_simulation(fed: Federation, first_run: Path) -> None:
    recs = metrics.read_jsonl(first_run / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert all(r["clients-ok"] == 2 for r in recs[1:]), recs
    sim = subprocess.run(
        [sys.executable, "-m", "fedsys_launch", "run", str(first_run / "config.yaml"),
         "--set", "name=sim", "--set", f"output-dir={fed.holder / 'sim'}",
         "--set", "resume=false", "--set", "engine=inprocess",
         "--set", "batch-clients=false"], cwd=ROOT, env=ENV, capture_output=True, text=True,
        timeout=600, check=False)
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    dep_model = torch.load(first_run / "fedavg" / "model.pt")
    sim_model = torch.load(fed.holder / "sim" / "sim" / "fedavg" / "model.pt")
    assert dep_model.keys() == sim_model.keys()
    assert all(torch.equal(dep_model[k], sim_model[k]) for k in dep_model)


PROBE = """
import socket, ssl, sys, json, urllib.request
host, ports, ca = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], sys.argv[3]
out = {}
for p in ports:
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, p)); out[p] = "open"
    except OSError as e:
        out[p] = type(e).__name__
    finally:
        s.close()
ctx = ssl.create_default_context(cafile=ca)
def post(path):
    req = urllib.request.Request(f"https://fl.example.org:{ports[0]}{path}", data=b"x",
                                 method="POST")
    try:
        return urllib.request.urlopen(req, context=ctx, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
out["control"] = post("/flwr.proto.Control/ListRuns")
out["fleet"] = post("/v1/fleet/pull-messages")
print(json.dumps(out))
"""


def test_from_a_site_only_the_sites_port_answers(fed: Federation, first_run: Path) -> None:
    import json

    listening = fed.net.run("srv", ["ss", "-ltnH"]).stdout.split("\n")
    ports = sorted({int(ln.split()[3].rsplit(":", 1)[1]) for ln in listening if ln.strip()})
    assert SITES_PORT in ports and LINK_PORT in ports, listening
    order = [SITES_PORT, *[p for p in ports if p != SITES_PORT]]
    probe = fed.net.run("site0", [sys.executable, "-c", PROBE, "198.51.100.1",
                                  ",".join(map(str, order)),
                                  str(fed.site_dir("site0") / "kit" / "ca.crt")])
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout)
    assert got.pop(str(SITES_PORT)) == "open", got
    # the SuperLink's own refusal of a malformed Fleet call (not the proxy's 404)
    assert got.pop("fleet") in (400, 401, 403, 415), got
    assert got.pop("control") == 404, got            # the proxy passes nothing else
    assert set(got.values()) == {"ConnectionRefusedError"}, got


def test_a_site_whose_link_is_cut_mid_round(fed: Federation, first_run: Path) -> None:
    """docs/deployment.md §8, "A site dies mid-round": no reply comes, the round waits
    ``round-timeout`` and aggregates the others; the site serves again once its link is back."""
    before = fed.log("site1").count("Receiving: train message")
    run = fed.submit("cut", 2, **{"num-server-rounds": 1, "round-timeout": CUT_ROUND_TIMEOUT,
                                  "min-available-clients": 2})
    fed.wait(lambda: fed.log("site1").count("Receiving: train message") > before, 300,
             "site1 to receive its train message")
    fed.net.link("site1", up=False)
    try:
        out = finished(run)
    finally:
        fed.net.link("site1", up=True)
    recs = metrics.read_jsonl(fed.runs / "cut" / "fedavg" / "metrics.jsonl")
    assert recs[-1]["round"] == 1 and recs[-1]["clients-ok"] == 1, (recs, out[-3000:])
    # the site's SuperNode retried until its link was back (the next test's run has it)
    assert fed.sites["site1"].poll() is None, fed.log("site1")[-3000:]
    assert "Connection attempt failed" in fed.log("site1")


@dataclass
class Third:
    """The run after a third site joined, watched by the operator and a site's local user."""

    node: int                  #: the new site's node id
    recs: list[dict[str, Any]]  #: its metrics
    status: list[str]          #: ``fedsys deploy status --kit`` outputs during the run
    scan: dict[str, Any]       #: what another uid found in /proc during the run
    as_other: bool             #: whether the scan ran as another uid


@pytest.fixture(scope="module")
def third(fed: Federation, first_run: Path) -> Third:
    """site2, with its own data (``add-site --data-dir``), added while the federation is
    up; then a run of all three (site1 too, after its link was cut when the test above
    ran), during which the operator polls ``deploy status`` and another uid scans /proc
    for task tokens (test_deploy_redteam.py's scan, here against the kits' processes)."""
    import json

    own = fed.site_dir("site2") / "data"
    own.mkdir(parents=True)
    node = fed.add_site("site2", 12, "--data-dir", str(own))
    assert "partition-id=2 data-dir=" in (fed.kit / "sites" / "site2" / "site.env").read_text()
    fed.online(3)
    as_other = os.getuid() == 0 and os.path.exists(SYSTEM_PYTHON)
    stop = Path(tempfile.gettempdir()) / f"fedsys-multihost-scan-{os.getpid()}"
    stop.unlink(missing_ok=True)
    scan = subprocess.Popen([SYSTEM_PYTHON if as_other else sys.executable, "-c", SCAN, "600",
                             str(stop)], stdout=subprocess.PIPE, text=True, cwd="/",
                            user=NOBODY if as_other else None)
    # two rounds of a whole local epoch each: a site holds its message for seconds, and
    # one status call takes about as long
    run = fed.submit("three", 3, **{"local-steps": 0, "local-epochs": 1})
    seen: list[str] = []

    def in_run() -> bool:  # the operator's view while the run goes on
        st = fed.fedsys("srv", "deploy", "status", "--kit", str(fed.kit), timeout=120)
        seen.append(st.stdout + st.stderr)
        if run.poll() is not None:
            raise AssertionError("the run ended before status showed a site in it")
        rows = [ln for ln in st.stdout.splitlines() if "site2" in ln]
        return bool(rows) and "online" in rows[0] and any(c.isdigit() for c in
                                                          rows[0].split("│")[5])

    try:
        fed.wait(in_run, 300, "status to show site2 in the run")
        finished(run)
    finally:
        stop.touch()
        out, _ = scan.communicate(timeout=60)
        stop.unlink(missing_ok=True)
        if run.poll() is None:
            run.kill()
    assert scan.returncode == 0
    recs = metrics.read_jsonl(fed.runs / "three" / "fedavg" / "metrics.jsonl")
    return Third(node, recs, seen, json.loads(out), as_other)


def test_a_site_added_while_up_joins_the_next_run(third: Third) -> None:
    """Every site in the run; one local epoch each: site2 on all its data (the synthetic
    set's 2,000 training images), site0 and site1 on their half each."""
    assert all(r["clients-ok"] == 3 for r in third.recs[1:]), third.recs
    assert third.recs[1]["trained-examples"] == 2000 + 1000 + 1000, third.recs


def test_status_shows_each_site_online_last_seen_and_in_the_run(third: Third) -> None:
    table = third.status[-1]
    rows = {ln.split("│")[1].strip(): ln for ln in table.splitlines()
            if ln.count("│") > 6 and ln.split("│")[1].strip().startswith("site")}
    assert sorted(rows) == ["site0", "site1", "site2"], table
    assert all("online" in r and " s ago" in r for r in rows.values()), table
    assert str(third.node) in rows["site2"], table
    assert "running" in table  # the runs table (flwr ls)


def test_a_sites_local_user_finds_no_token(third: Third) -> None:
    """The red-team row "a site's local user" against the kits' processes."""
    assert third.scan["apps"], "the scan saw no app process: it proves nothing"
    assert all("--token ***" in a for a in third.scan["apps"]), third.scan["apps"]
    assert third.scan["tokens"] == [], third.scan
    if third.as_other:
        assert third.scan["environs"] == 0, third.scan


def test_no_security_patch_is_off(fed: Federation, first_run: Path) -> None:
    """The kits start the components with every security patch (they fail closed; one
    turned off by FEDSYS_FLOWER_PATCHES logs a WARNING naming it)."""
    for name in ("server", "site0", "site1"):
        assert "Flower patch" not in fed.log(name), fed.log(name)[-2000:]


OWNERSHIP_PROBE = r"""
import functools, json, sys, time
import httpx
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.proto.fleet_pb2 import PullMessagesRequest, PushMessagesRequest
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest
from flwr.proto.node_pb2 import Node
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
from tests.integration.test_deploy_redteam import _reply_to

address, ca, key0, n0, key1, n1 = sys.argv[1:7]
n0, n1 = int(n0), int(n1)

def fleet(path):
    key = load_ssh_private_key(open(path, "rb").read(), password=None)
    return FleetHttpClient.from_server_address(
        address, insecure=False, root_certificates=ca,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                      NodeAuthHttpInterceptor(key, key.public_key())])

def status(call):
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200

owner, other = fleet(key0), fleet(key1)
end = time.monotonic() + 180
while True:
    res = owner.PullMessages(PullMessagesRequest(node=Node(node_id=n0)))
    if res.messages_list:
        break
    if time.monotonic() > end:
        sys.exit("no message for site0 within 180 s")
    time.sleep(0.5)
msg, tree = res.messages_list[0], res.message_object_trees[0]
run, mid, own = msg.metadata.run_id, msg.metadata.message_id, tree.object_id
node1 = Node(node_id=n1)
out = {"run": run,
       "pull": status(lambda: other.PullObject(PullObjectRequest(node=node1, run_id=run,
                                                                 object_id=own))),
       "confirm": status(lambda: other.ConfirmMessageReceived(ConfirmMessageReceivedRequest(
           node=node1, run_id=run, message_object_id=mid))),
       "push": [status(functools.partial(other.PushMessages, PushMessagesRequest(
           node=node1, messages_list=[_reply_to(msg, src)], message_object_trees=[tree])))
                for src in (n0, n1)],
       "owner": status(lambda: owner.PullObject(PullObjectRequest(
           node=Node(node_id=n0), run_id=run, object_id=own)))}
print(json.dumps(out))
"""


def _supernode_of(site: Path) -> int:
    """The pid of the SuperNode a site kit's start.sh started (its key is under ``site``)."""
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "fedsys_launch.deploy.supernode" in cmd and str(site / "keys") in cmd:
            return int(d.name)
    raise AssertionError(f"no SuperNode of {site} running")


def test_a_registered_site_reaches_only_what_was_handed_to_it(fed: Federation,
                                                              third: Third) -> None:
    """The red-team row "a registered site" against the kits, across the namespaces: from
    site1's namespace, with site1's key, site0's message can be neither pulled, confirmed
    nor answered through fl.example.org:9093 (403); site0's key still pulls it."""
    import json
    import signal

    ids = {n: int(json.loads((fed.kit / "sites" / n / "site.json").read_text())["node-id"])
           for n in ("site0", "site1")}
    node0 = _supernode_of(fed.site_dir("site0"))
    os.kill(node0, signal.SIGSTOP)  # site0's own SuperNode would take the message first
    run = None
    try:
        run = fed.submit("owned", 3, **{"num-server-rounds": 1, "round-timeout": 20.0,
                                        "node-wait-timeout": 60.0})
        probe = fed.net.run("site1", [
            sys.executable, "-c", OWNERSHIP_PROBE, f"{SERVER_NAME}:{SITES_PORT}",
            str(fed.site_dir("site1") / "kit" / "ca.crt"),
            str(fed.site_dir("site0") / "keys" / "site0"), str(ids["site0"]),
            str(fed.site_dir("site1") / "keys" / "site1"), str(ids["site1"])],
            env={**ENV, "PYTHONPATH": str(ROOT)}, timeout=300)
    finally:
        os.kill(node0, signal.SIGCONT)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    got = json.loads(probe.stdout)
    assert (got["pull"], got["confirm"], got["push"]) == (403, 403, [403, 403]), got
    assert got["owner"] == 200, got
    fed.flwr("stop", str(got["run"]), CONNECTION)
    run.communicate(timeout=300)


def test_a_removed_sites_key_is_refused(fed: Federation, first_run: Path) -> None:
    import json

    node = int(json.loads((fed.kit / "sites" / "site0" / "site.json").read_text())["node-id"])
    gone = fed.fedsys("srv", "deploy", "remove-site", "site0", "--kit", str(fed.kit))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    fed.wait(lambda: fed.sites["site0"].poll() is not None or fed.nodes().get(node) != "online",
             120, "site0 to be cut off")
    Netns.stop(fed.sites["site0"])
    again = fed.start("site0", "site0-again",
                      ["bash", str(fed.site_dir("site0") / "kit" / "start.sh")])
    try:
        again.wait(120)
    except subprocess.TimeoutExpired:
        Netns.stop(again)
    assert fed.nodes().get(node) != "online"
    st = fed.fedsys("srv", "deploy", "status", "--kit", str(fed.kit))
    assert any("site0" in ln and "removed" in ln for ln in st.stdout.splitlines()), st.stdout
