"""A real Flower deployment as local processes on 127.0.0.1.

The same topology as ``docker-compose.yml``, one process per container: a SuperLink,
the server-side SuperExec that runs the fedsys ServerApp, and N SuperNodes, each
with its own client-side SuperExec that runs the fedsys ClientApp (Flower's
``--isolation process``).  Every component has its own ``FLWR_HOME`` (as if on a
separate machine), is started from a neutral directory and is stopped by PID.

Optionally TLS (a private CA and a SuperLink certificate, ``deploy/make-certs.sh``)
and node authentication (one key pair per SuperNode, registered with the SuperLink
by ``deploy/node-keys.sh``, plus a shared secret between the SuperLink and its
SuperExec).  Everything lives in one deployment directory::

    deploy.json            state: ports, flags, PIDs (read by later invocations)
    certs/ keys/ secret    TLS material, SuperNode keys, SuperExec secret
    cli/config.toml        the ``flwr`` CLI's connection ``fedsys-local``
    cli/app-<digest>/      the app's FAB files, what ``flwr run`` is given (:func:`~fedsys_launch.deploy.fab_staging.staged_app`)
    home/<component>/      each component's FLWR_HOME and working directory
    logs/<component>.log   each component's output
    superlink.db           SuperLink state (runs, registered nodes)

This module holds the topology, each component's command line and its start and stop;
the processes are followed through ``/proc`` (:mod:`fedsys_launch.process.supervision`),
the ``flwr`` CLI is :class:`fedsys_launch.deploy.flwr_cli.FlwrCli` (a deployment's
:attr:`LocalDeployment.flwr_cli`) and the app it submits is staged by
:mod:`fedsys_launch.deploy.fab_staging`.  Used by ``fedsys deploy``
(:mod:`fedsys_launch.commands.deploy_cli`) and the deployment tests.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedsys_launch.deploy.errors import DeployError
from fedsys_launch.deploy.flwr_cli import CONNECTION, FlwrCli, connection_toml, console_script
from fedsys_launch.deploy.proxy import (
    ProxyLimits,
    ProxyTLS,
    default_max_body,
    nginx_conf,
    write_conf,
)
from fedsys_launch.process.flower_env import deployment_env
from fedsys_launch.process.supervision import (
    HOST,
    alive,
    descendants,
    free_port,
    same_process,
    session_nice,
    signal_all,
    start_time,
    wait_port,
)

STATE_FILE = "deploy.json"
SCRIPTS = Path(__file__).resolve().parents[2] / "deploy"
SUPERLINK, PROXY, SERVER_EXEC = "superlink", "proxy", "superexec-server"


def nginx_bin() -> str:
    """The ``nginx`` the proxy runs (Debian's ``nginx-light`` is enough); one line when
    there is none."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None)
    if found is None:
        raise DeployError("nginx is not installed: the sites' port is an nginx reverse proxy "
                          "that forwards Flower's Fleet API only (apt-get install nginx-light)")
    return found


def node_name(i: int) -> str:
    """Name of SuperNode ``i`` (also its key file and its ``--name`` at registration)."""
    return f"supernode-{i}"


def node_exec_name(i: int) -> str:
    """Name of the client-side SuperExec of SuperNode ``i``."""
    return f"superexec-{i}"


@dataclass
class Component:
    """One started process: its command line, PID and kernel start time."""

    args: list[str]
    pid: int = 0
    start_time: int = 0
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LocalDeployment:
    """SuperLink, server SuperExec and SuperNodes with their SuperExecs, under ``root``.

    Parameters
    ----------
    root : Path
        The deployment directory (state, logs, certificates, keys).
    num_nodes : int
        Number of SuperNodes; node ``i`` holds ``partition-id=i`` of ``num_nodes``.
    data_dir : str
        ``data-dir`` passed to every SuperNode in its node config (empty: none).
    tls : bool
        Serve the SuperLink over HTTPS with a certificate from a private CA.
    auth : bool
        SuperNode authentication (registered keys only) and a SuperExec secret.
    port : int
        The sites' port: the reverse proxy (:mod:`fedsys_launch.deploy.proxy`) that forwards Flower's
        Fleet API, and nothing else, to the SuperLink; 0 picks a free one.
    link_port : int
        The SuperLink's own port on loopback (Fleet, Control and Runtime APIs): the
        operator's ``flwr`` CLI and the server's SuperExec use it; 0 picks a free one.
    gpus : str
        Comma-separated CUDA device ids dealt round robin to the client SuperExecs
        (``CUDA_VISIBLE_DEVICES``); empty leaves the environment as it is.
    roots : str
        ``FEDSYS_ROOTS`` of the server's SuperExec (directories joined by ``:``): where a
        submitted run config's paths may lie on the server (:mod:`fedsys.confine`).  None
        may contain ``root`` or lie in it (:meth:`refuse_roots`); every SuperExec that
        runs apps also gets ``FEDSYS_DENY=root``, so no run config names a path in the
        deployment whatever the roots.
    plugins : str
        ``FEDSYS_PLUGINS`` of every SuperExec: the modules a run's ``plugins`` may name
        (empty: none).
    max_body : int
        The sites' port's body cap in bytes (``client_max_body_size``, refused 413 above
        it; 0: :func:`fedsys_launch.deploy.proxy.default_max_body`, twice Flower's array chunk).
    node_nice : int
        Scheduling niceness of the SuperNodes and their SuperExecs, and so of the
        ClientApps they start (default 0: normal priority; 19 for tens of nodes on a
        machine given to the deployment), set on the process and on its session's
        scheduling group (Linux's autogroup: a process's own niceness counts only within
        its session).  With more nodes than cores, niced nodes leave the SuperLink the
        CPU it needs to answer them; not the default, since niced nodes also wait for
        every other busy process (docs/development.md "Why things are as they are").
        The SuperLink and the server SuperExec keep the caller's niceness.
    """

    root: Path
    num_nodes: int = 2
    data_dir: str = ""
    tls: bool = False
    auth: bool = False
    port: int = 0
    link_port: int = 0
    gpus: str = ""
    roots: str = ""
    plugins: str = ""
    node_nice: int = 0
    max_body: int = 0
    node_ports: list[int] = field(default_factory=list)
    components: dict[str, Component] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    #: the deployment's ``flwr`` CLI (its home ``cli/``; submissions logged under ``logs/``)
    flwr_cli: FlwrCli = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        if self.port == 0:
            self.port = free_port()
        if self.link_port == 0:
            self.link_port = free_port()
        self.flwr_cli = FlwrCli(self.cli_home, self.root / "logs")

    # ------------------------------------------------------------------ paths

    @property
    def address(self) -> str:
        """``host:port`` the sites reach: the proxy, which forwards the Fleet API only."""
        return f"{HOST}:{self.port}"

    @property
    def control_address(self) -> str:
        """``127.0.0.1:port`` of the SuperLink itself (Control and Runtime APIs): the
        operator's ``flwr`` CLI and the server's SuperExec."""
        return f"{HOST}:{self.link_port}"

    @property
    def cli_home(self) -> Path:
        """``FLWR_HOME`` of the ``flwr`` CLI, holding the connection ``fedsys-local``."""
        return self.root / "cli"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate every client needs to verify the SuperLink."""
        return self.root / "certs" / "ca.crt"

    def key_file(self, i: int) -> Path:
        """Private key of SuperNode ``i`` (its ``.pub`` is registered)."""
        return self.root / "keys" / node_name(i)

    def site_secret(self, i: int) -> Path:
        """The secret between SuperNode ``i``'s Runtime API and its SuperExec (made by
        ``deploy/node-keys.sh`` beside the key; it stays on that site)."""
        return self.root / "keys" / f"{node_name(i)}.secret"

    @property
    def secret_file(self) -> Path:
        """The secret between the SuperLink's Runtime API and the server's SuperExec."""
        return self.root / "certs" / "superexec.secret"

    def log_file(self, name: str) -> Path:
        """Output of one component."""
        return self.root / "logs" / f"{name}.log"

    @property
    def env(self) -> dict[str, str]:
        """Environment of every Flower process (telemetry and runtime installs off); the
        caller's confinement policy is not inherited: each component gets the one of
        this deployment (:meth:`command`)."""
        return deployment_env()

    # ------------------------------------------------------------------ state

    def save(self) -> None:
        """Write ``deploy.json`` so later invocations find this deployment."""
        state = {
            "num_nodes": self.num_nodes, "data_dir": self.data_dir, "tls": self.tls,
            "auth": self.auth, "port": self.port, "link_port": self.link_port,
            "gpus": self.gpus, "roots": self.roots, "plugins": self.plugins,
            "node_nice": self.node_nice, "max_body": self.max_body,
            "node_ports": self.node_ports,
            "components": {k: asdict(c) for k, c in self.components.items()},
        }
        tmp = self.root / (STATE_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(state, indent=1))
        tmp.replace(self.root / STATE_FILE)

    @classmethod
    def load(cls, root: Path) -> LocalDeployment:
        """Read the deployment that ``up`` wrote to ``root``."""
        path = Path(root) / STATE_FILE
        if not path.exists():
            raise DeployError(f"no deployment in {root} (start one with 'fedsys deploy up')")
        s = json.loads(path.read_text())
        dep = cls(Path(root), num_nodes=s["num_nodes"], data_dir=s["data_dir"], tls=s["tls"],
                  auth=s["auth"], port=s["port"], link_port=s.get("link_port", 0),
                  gpus=s.get("gpus", ""), roots=s.get("roots", ""),
                  plugins=s.get("plugins", ""),
                  node_nice=s.get("node_nice", 0), max_body=s.get("max_body", 0),
                  node_ports=list(s["node_ports"]))
        dep.components = {k: Component(**c) for k, c in s["components"].items()}
        return dep

    # ------------------------------------------------------------------ commands

    def names(self) -> list[str]:
        """Component names in start order."""
        nodes = [n for i in range(self.num_nodes) for n in (node_name(i), node_exec_name(i))]
        return [SUPERLINK, PROXY, SERVER_EXEC, *nodes]

    def _client_tls(self, flag: str) -> list[str]:
        return [flag, str(self.ca_cert)] if self.tls else ["--insecure"]

    def command(self, name: str) -> tuple[list[str], dict[str, str]]:
        """Command line and extra environment of one component."""
        secret = ["--superexec-auth-secret-file", str(self.secret_file)] if self.auth else []
        if name == SUPERLINK:
            certs = self.root / "certs"
            tls = (["--ssl-ca-certfile", str(self.ca_cert), "--ssl-certfile",
                    str(certs / "server.pem"), "--ssl-keyfile", str(certs / "server.key")]
                   if self.tls else ["--insecure"])
            auth = ["--enable-supernode-auth", *secret] if self.auth else []
            # Flower's flower-superlink with a longer SQLite busy timeout (fedsys_launch/deploy/superlink.py),
            # on loopback only: the sites reach it through the proxy
            return [sys.executable, "-m", "fedsys_launch.deploy.superlink", *tls, *auth, "--isolation", "process",
                    "--database", str(self.root / "superlink.db"),
                    "--disable-runtime-dependency-installation",
                    "--host", HOST, "--port", str(self.link_port)], {}
        if name == PROXY:
            work = self.root / "proxy"
            return [nginx_bin(), "-e", "stderr", "-p", str(work), "-c", str(work / "nginx.conf"),
                    "-g", "daemon off;"], {}
        policy = {"FEDSYS_PLUGINS": self.plugins} if self.plugins else {}
        policy["FEDSYS_DENY"] = str(self.root)  # keys, certs, CA, apps, database, logs
        if name == SERVER_EXEC:
            # Flower's flower-superexec, its app processes forked warm (fedsys_launch/deploy/superexec.py);
            # the operator's confinement of submitted run configs (fedsys.confine)
            if self.roots:
                policy["FEDSYS_ROOTS"] = self.roots
            return [sys.executable, "-m", "fedsys_launch.deploy.superexec", *self._client_tls("--root-certificates"),
                    *secret, "--runtime-api-address", self.control_address], policy
        kind, _, idx = name.rpartition("-")
        i = int(idx)
        site_secret = ["--superexec-auth-secret-file", str(self.site_secret(i))]
        if kind == "supernode":
            cfg = f"partition-id={i} num-partitions={self.num_nodes}"
            if self.data_dir:
                cfg += f' data-dir="{self.data_dir}"'
            auth = ["--auth-supernode-private-key", str(self.key_file(i))] if self.auth else []
            # Flower's flower-supernode with a wider ClientApp start window (fedsys_launch/deploy/supernode.py)
            return [sys.executable, "-m", "fedsys_launch.deploy.supernode",
                    *self._client_tls("--root-certificates"), *auth,
                    "--superlink", self.address, "--isolation", "process",
                    "--host", HOST, "--port", str(self.node_ports[i]), *site_secret,
                    "--node-config", cfg], {}
        env = dict(policy)
        if self.gpus:
            ids = [g.strip() for g in self.gpus.split(",") if g.strip()]
            env["CUDA_VISIBLE_DEVICES"] = ids[i % len(ids)]
        return [sys.executable, "-m", "fedsys_launch.deploy.superexec", "--insecure", *site_secret,
                "--runtime-api-address", f"{HOST}:{self.node_ports[i]}"], env

    def write_proxy_conf(self) -> Path:
        """Render the proxy's ``nginx.conf`` (:func:`fedsys_launch.deploy.proxy.nginx_conf`) under
        ``proxy/``: the sites' port forwards the Fleet API to the SuperLink's loopback port."""
        work = self.root / "proxy"
        for sub in ("", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (work / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        certs = self.root / "certs"
        tls = (ProxyTLS(str(certs / "server.pem"), str(certs / "server.key"), str(self.ca_cert))
               if self.tls else None)
        # as many files as this user may open, up to the renderer's default
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = ProxyLimits.nofile if hard == resource.RLIM_INFINITY else min(
            ProxyLimits.nofile, hard)
        limits = ProxyLimits(max_body=self.max_body or default_max_body(self.env),
                             nofile=nofile).for_sites(self.num_nodes)  # all on 127.0.0.1
        # started as root, its workers stay root: as nobody they could not buffer bodies
        # in the deployment directory (0700)
        return write_conf(work / "nginx.conf", nginx_conf(
            self.address, self.control_address, str(work), tls,
            access_log=str(self.log_file("proxy-access")), limits=limits,
            user="root" if os.geteuid() == 0 else None))

    # ------------------------------------------------------------------ processes

    def start(self, name: str) -> Component:
        """Start one component; a running instance of it is killed first (restart).

        Every process runs under umask 077: the SuperLink's database, the logs and
        whatever an app process writes are the deployment owner's alone."""
        self.kill(name)
        if name == PROXY:
            self.write_proxy_conf()
        args, extra = self.command(name)
        if name not in (SUPERLINK, PROXY, SERVER_EXEC) and self.node_nice:
            args = [shutil.which("nice") or "nice", "-n", str(self.node_nice), *args]
        home = self.root / "home" / name
        home.parent.mkdir(mode=0o700, exist_ok=True)
        home.mkdir(mode=0o700, exist_ok=True)
        log = self.log_file(name)
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**self.env, **extra, "FLWR_HOME": str(home)}
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            p = subprocess.Popen(args, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, umask=0o077)
        if name not in (SUPERLINK, PROXY, SERVER_EXEC) and self.node_nice:
            session_nice(p.pid, self.node_nice)
        self.procs[name] = p
        comp = Component(args, p.pid, start_time(p.pid), extra)
        self.components[name] = comp
        self.save()
        if name in (SUPERLINK, PROXY):  # a restart too: nothing can talk to it before it listens
            try:
                wait_port(self.link_port if name == SUPERLINK else self.port)
            except TimeoutError:
                self.refuse_dead()
                raise
        return comp

    def is_running(self, name: str) -> bool:
        """Whether the recorded process of ``name`` still runs (same PID, same start)."""
        c = self.components.get(name)
        return c is not None and c.pid > 0 and same_process(c.pid, c.start_time)

    def all_pids(self) -> list[int]:
        """PIDs of every running component and of all their descendants (Flower
        detaches its SuperExec children into their own sessions, so process groups
        are not enough)."""
        roots = [self.components[n].pid for n in self.components if self.is_running(n)]
        return sorted({d for r in roots for d in descendants(r)})

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one component and its descendants, and wait until they are gone."""
        if self.is_running(name):
            pids = descendants(self.components[name].pid)
            signal_all(pids, sig)
            self._reap(pids, 30.0)
        self.procs.pop(name, None)

    def _reap(self, pids: list[int], timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and any(alive(p) for p in pids):
            for p in self.procs.values():
                p.poll()
            time.sleep(0.1)

    def down(self) -> int:
        """Stop every process and its descendants, the sites first (SIGTERM, then SIGKILL
        after 15 s): a SuperNode stopped while the SuperLink still runs signs off, so a
        new ``up`` can bring the same node keys online at once.

        Returns the number of processes that were stopped.
        """
        sites = [n for n in self.components if n not in (SUPERLINK, PROXY, SERVER_EXEC)]
        stopped = 0
        for group in (sites, [n for n in self.components if n not in sites]):
            pids = sorted({d for n in group if self.is_running(n)
                           for d in descendants(self.components[n].pid)})
            signal_all(pids, signal.SIGTERM)
            self._reap(pids, 15.0)
            signal_all([p for p in pids if alive(p)], signal.SIGKILL)
            self._reap(pids, 10.0)
            left = [p for p in pids if alive(p)]
            if left:
                raise DeployError(f"processes {left} survived SIGKILL")
            stopped += len(pids)
        for p in self.procs.values():
            p.poll()
        self.procs.clear()
        for c in self.components.values():
            c.pid = c.start_time = 0
        if self.components:
            self.save()
        return stopped

    # ------------------------------------------------------------------ set-up

    def _script(self, name: str, *args: str) -> None:
        script = SCRIPTS / name
        if not script.exists():
            raise DeployError(f"{script} not found: run fedsys deploy from a fedsys checkout")
        env = {**self.env, "FLWR_HOME": str(self.cli_home), "FLWR_BIN": console_script("flwr")}
        proc = subprocess.run(["bash", str(script), *args], env=env, cwd=self.root,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DeployError(f"{name} failed:\n{proc.stdout}{proc.stderr}".strip())

    def write_connection(self) -> None:
        """Write the CLI's ``config.toml`` with the connection ``fedsys-local``: the
        SuperLink's loopback port, where the Control API is (the sites' port has none)."""
        self.cli_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(
            connection_toml(self.control_address, self.ca_cert if self.tls else None))

    def refuse_roots(self) -> None:
        """Raise :class:`DeployError` if a root of :attr:`roots` contains the deployment
        directory or lies in it (or there are none: the app's default, ``<its working
        directory>/runs``, is in it): a run config could name the keys, certificates and
        database there, and ``FEDSYS_DENY`` alone would refuse every run."""
        roots = [Path(r).expanduser().resolve() for r in self.roots.split(os.pathsep) if r]
        if not roots:
            raise DeployError("give the roots, directories outside the deployment directory "
                              f"{self.root} where runs may write (--roots)")
        for r in roots:
            if self.root.is_relative_to(r) or r.is_relative_to(self.root):
                how = "contains" if self.root.is_relative_to(r) else "lies in"
                raise DeployError(
                    f"the root {r} {how} the deployment directory {self.root}: a run config "
                    "could name its keys, certificates and database; choose a --dir outside "
                    "the roots, or --roots (FEDSYS_ROOTS) apart from it")

    def refuse_if_running(self) -> None:
        """Raise :class:`DeployError` if a deployment in ``root`` still runs."""
        old = LocalDeployment.load(self.root) if (self.root / STATE_FILE).exists() else None
        if old is not None and any(old.is_running(n) for n in old.components):
            raise DeployError(f"a deployment is running in {self.root}; "
                              "'fedsys deploy down' stops it")

    def up(self, wait: float = 120.0) -> None:
        """Start everything, make each site's key and Runtime API secret (and register
        the keys with ``auth``), wait until all nodes are online."""
        self.refuse_roots()
        nginx_bin()  # before anything starts: one line when there is no proxy to run
        self.refuse_if_running()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self.node_ports = [free_port() for _ in range(self.num_nodes)]
        self.components = {}
        self.save()
        if self.tls:  # the CA's key goes where no component reads: ca/, not certs/
            self._script("make-certs.sh", "-d", str(self.root / "certs"),
                         "-k", str(self.root / "ca"))
        if self.auth and not self.secret_file.exists():
            self.secret_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(os.urandom(32).hex())
        self.write_connection()
        self.start(SUPERLINK)
        sites = [node_name(i) for i in range(self.num_nodes)]
        self._script("node-keys.sh", "-d", str(self.root / "keys"),
                     *(["-r", CONNECTION] if self.auth else []), *sites)
        for name in self.names()[1:]:
            self.start(name)
        self.wait_online(self.num_nodes, wait)

    # ------------------------------------------------------------------ online

    def refuse_dead(self) -> None:
        """Raise :class:`DeployError` naming the components that exited, with the end of
        the first one's log."""
        dead = [c for c in self.components if not self.is_running(c)]
        if dead:
            log = self.log_file(dead[0])
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
            raise DeployError(f"{', '.join(dead)} exited; {log}:\n{tail}")

    def wait_online(self, n: int, timeout: float = 120.0, settle: float = 2.0
                    ) -> list[dict[str, Any]]:
        """Wait until ``n`` SuperNodes are online and every component still runs
        ``settle`` seconds later (a SuperExec that fails as its node comes online, a
        wrong secret or app directory, dies within a second of it); fail early if a
        component died."""
        end = time.monotonic() + timeout
        while True:
            self.refuse_dead()
            nodes = self.flwr_cli.nodes()
            online = [x for x in nodes if x.get("status") == "online"]
            if len(online) >= n:
                time.sleep(settle)
                self.refuse_dead()
                return online
            if time.monotonic() > end:
                raise DeployError(f"{len(online)} of {n} SuperNodes online after {timeout:.0f} s")
            time.sleep(1.0)

