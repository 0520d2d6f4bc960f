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
    cli/app-<digest>/      the app's FAB files, what ``flwr run`` is given (:func:`staged_app`)
    home/<component>/      each component's FLWR_HOME and working directory
    logs/<component>.log   each component's output
    superlink.db           SuperLink state (runs, registered nodes)

Used by ``fedsys deploy`` (:mod:`fedsys_launch.deploy_cli`) and the deployment tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedsys.config import ConfigError, toml_text
from fedsys_launch.proxy import (
    ProxyLimits,
    ProxyTLS,
    default_max_body,
    nginx_conf,
    write_conf,
)
from fedsys_launch.simulation import FLWR_ENV

HOST = "127.0.0.1"
CONNECTION = "fedsys-local"
STATE_FILE = "deploy.json"
SCRIPTS = Path(__file__).resolve().parents[1] / "deploy"
SUPERLINK, PROXY, SERVER_EXEC = "superlink", "proxy", "superexec-server"


class DeployError(ConfigError):
    """A deployment could not be started, found or used (printed as ``error: ...``)."""


class RunNotStartedError(RuntimeError):
    """``flwr run`` ended before the SuperLink started a run (unreachable, refused, bad
    certificate): nothing ran, so there is nothing to resume."""


def _fab_globs(pattern: str) -> str | None:
    """A ``fab-include`` pattern (gitignore style) as a :meth:`Path.glob` pattern, or
    ``None`` where the two could disagree (a negation, a character class)."""
    if pattern.startswith("!") or "[" in pattern or "\\" in pattern:
        return None
    if pattern.endswith("/"):
        pattern += "**/*"
    if pattern.startswith("/"):
        return pattern[1:]
    return pattern if "/" in pattern.rstrip("/") else f"**/{pattern}"


def staged_app(app_dir: Path, into: Path) -> Path:
    """The directory ``flwr run`` builds the FAB from: ``app_dir`` itself, or, where its
    ``pyproject.toml`` lists ``fab-include`` patterns under ``[tool.flwr.app]`` (fedsys's
    does), a copy of ``pyproject.toml``, ``.gitignore`` and the files the patterns match,
    in ``into/app-<digest of the copy>`` (made once per content, never changed after).

    Flower's ``flwr run`` walks every file under the directory it is given before it
    filters, a checkout's virtual environments and ``runs/`` included (docs/deployment.md
    gives the cost).  The copy holds the files the FAB is built from, so the FAB and its
    hash are the same (``tests/unit/test_deploy_cli.py``).
    """
    project = app_dir / "pyproject.toml"
    try:
        patterns = tomllib.loads(project.read_text())["tool"]["flwr"]["app"]["fab-include"]
        globs = [_fab_globs(str(p)) for p in patterns]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return app_dir
    if not globs or None in globs:
        return app_dir
    files = sorted({p for g in globs if g is not None for p in app_dir.glob(g)
                    if p.is_file() and not p.is_symlink()})
    files = [project, *([app_dir / ".gitignore"] if (app_dir / ".gitignore").is_file() else []),
             *(f for f in files if f != project)]
    content = {f.relative_to(app_dir).as_posix(): f.read_bytes() for f in files}
    digest = hashlib.sha256()
    for rel, data in content.items():
        digest.update(rel.encode() + b"\0" + data + b"\0")
    target = into / f"app-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    tmp = into / f".app-{os.getpid()}-{time.time_ns()}"
    for rel, data in content.items():
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    try:
        tmp.rename(target)
    except OSError:  # another submission made the same copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def free_port() -> int:
    """Return an unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> None:
    """Block until something listens on ``127.0.0.1:port``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {HOST}:{port} after {timeout:.0f} s")


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


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
        The sites' port: the reverse proxy (:mod:`fedsys_launch.proxy`) that forwards Flower's
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
        it; 0: :func:`fedsys_launch.proxy.default_max_body`, twice Flower's array chunk).
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

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        if self.port == 0:
            self.port = free_port()
        if self.link_port == 0:
            self.link_port = free_port()

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
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        inherited = {k: v for k, v in os.environ.items()
                     if k not in ("FEDSYS_ROOTS", "FEDSYS_PLUGINS", "FEDSYS_DENY")}
        return {**inherited, **FLWR_ENV, "PATH": path}

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
            # Flower's flower-superlink with a longer SQLite busy timeout (fedsys_launch/superlink.py),
            # on loopback only: the sites reach it through the proxy
            return [sys.executable, "-m", "fedsys_launch.superlink", *tls, *auth, "--isolation", "process",
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
            # Flower's flower-superexec, its app processes forked warm (fedsys_launch/superexec.py);
            # the operator's confinement of submitted run configs (fedsys.confine)
            if self.roots:
                policy["FEDSYS_ROOTS"] = self.roots
            return [sys.executable, "-m", "fedsys_launch.superexec", *self._client_tls("--root-certificates"),
                    *secret, "--runtime-api-address", self.control_address], policy
        kind, _, idx = name.rpartition("-")
        i = int(idx)
        site_secret = ["--superexec-auth-secret-file", str(self.site_secret(i))]
        if kind == "supernode":
            cfg = f"partition-id={i} num-partitions={self.num_nodes}"
            if self.data_dir:
                cfg += f' data-dir="{self.data_dir}"'
            auth = ["--auth-supernode-private-key", str(self.key_file(i))] if self.auth else []
            # Flower's flower-supernode with a wider ClientApp start window (fedsys_launch/supernode.py)
            return [sys.executable, "-m", "fedsys_launch.supernode",
                    *self._client_tls("--root-certificates"), *auth,
                    "--superlink", self.address, "--isolation", "process",
                    "--host", HOST, "--port", str(self.node_ports[i]), *site_secret,
                    "--node-config", cfg], {}
        env = dict(policy)
        if self.gpus:
            ids = [g.strip() for g in self.gpus.split(",") if g.strip()]
            env["CUDA_VISIBLE_DEVICES"] = ids[i % len(ids)]
        return [sys.executable, "-m", "fedsys_launch.superexec", "--insecure", *site_secret,
                "--runtime-api-address", f"{HOST}:{self.node_ports[i]}"], env

    def write_proxy_conf(self) -> Path:
        """Render the proxy's ``nginx.conf`` (:func:`fedsys_launch.proxy.nginx_conf`) under
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
            _session_nice(p.pid, self.node_nice)
        self.procs[name] = p
        comp = Component(args, p.pid, _start_time(p.pid), extra)
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
        return c is not None and c.pid > 0 and _same_process(c.pid, c.start_time)

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
            _signal_all(pids, sig)
            self._reap(pids, 30.0)
        self.procs.pop(name, None)

    def _reap(self, pids: list[int], timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and any(_alive(p) for p in pids):
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
            _signal_all(pids, signal.SIGTERM)
            self._reap(pids, 15.0)
            _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)
            self._reap(pids, 10.0)
            left = [p for p in pids if _alive(p)]
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
        env = {**self.env, "FLWR_HOME": str(self.cli_home), "FLWR_BIN": _bin("flwr")}
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

    # ------------------------------------------------------------------ flwr CLI

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``flwr ARGS`` with the deployment's CLI home."""
        return subprocess.run([_bin("flwr"), *args], cwd=self.cli_home,
                              env={**self.env, "FLWR_HOME": str(self.cli_home),
                                   "COLUMNS": os.environ.get("COLUMNS", "160")},
                              capture_output=True, text=True, timeout=timeout, check=False)

    def nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list`` as dicts (``node-id``, ``status``, ...)."""
        proc = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        try:
            return list(json.loads(proc.stdout)["nodes"])
        except (ValueError, KeyError):
            raise DeployError(f"flwr supernode list failed:\n{proc.stdout}{proc.stderr}") from None

    def runs(self) -> list[dict[str, Any]]:
        """``flwr ls`` as dicts (``run-id``, ``fab-id``, ``status``, ``elapsed``, ...)."""
        proc = self.flwr("ls", CONNECTION, "--format", "json")
        try:
            return list(json.loads(proc.stdout)["runs"])
        except (ValueError, KeyError):
            raise DeployError(f"flwr ls failed:\n{proc.stdout}{proc.stderr}") from None

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
            nodes = self.nodes()
            online = [x for x in nodes if x.get("status") == "online"]
            if len(online) >= n:
                time.sleep(settle)
                self.refuse_dead()
                return online
            if time.monotonic() > end:
                raise DeployError(f"{len(online)} of {n} SuperNodes online after {timeout:.0f} s")
            time.sleep(1.0)

    def submit(self, app_dir: Path, run_config: Mapping[str, object],
               log: Path | None = None) -> subprocess.Popen[str]:
        """Start ``flwr run APP fedsys-local --stream`` in the background.

        Its output goes to ``log`` (default ``logs/flwr-run.log``), or to a pipe
        when ``log`` is ``None`` and the caller reads ``stdout``.
        """
        self.cli_home.mkdir(parents=True, exist_ok=True)
        app_dir = staged_app(app_dir, self.cli_home)
        rc_file = self.cli_home / f"run-config-{time.time_ns()}.toml"
        rc_file.write_text(run_config_toml(run_config))
        rc_file.chmod(0o600)
        out = (os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
               if log is not None else None)
        try:
            return subprocess.Popen(
                [_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream",
                 "--run-config", str(rc_file)],
                cwd=self.cli_home, env={**self.env, "FLWR_HOME": str(self.cli_home)},
                stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()

    def flwr_run(self, app_dir: Path, run_config: Mapping[str, object], timeout: float = 600,
                 echo: bool = False) -> str:
        """``flwr run APP fedsys-local --stream``; return its output (``echo``: also print it)."""
        log = self.root / "logs" / f"flwr-run-{time.time_ns()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = self.submit(app_dir, run_config, log)
        end = time.monotonic() + timeout
        with log.open(errors="replace") as f:
            while True:
                done = proc.poll() is not None
                chunk = f.read()
                if echo and chunk:
                    print(chunk, end="", flush=True)
                if done:
                    break
                if time.monotonic() > end:
                    _signal_all(descendants(proc.pid), signal.SIGKILL)
                    proc.wait()
                    raise RuntimeError(f"flwr run took longer than {timeout:.0f} s; "
                                       f"output in {log}")
                time.sleep(0.2)
        out = log.read_text(errors="replace")
        run_id = started_run(out)
        if run_id is None:
            raise RunNotStartedError(f"flwr run exited {proc.returncode} before a run started "
                                     f"(output in {log}):\n{out[-3000:]}")
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run failed (exit {proc.returncode}):\n{out[-3000:]}")
        status = self.run_status(run_id)
        if status != "finished:completed":  # flwr run --stream exits 0 however the run ended
            raise RuntimeError(f"run {run_id} ended {status} (flwr ls); its log:\n{out[-3000:]}")
        return out

    def run_status(self, run_id: int) -> str:
        """The status ``flwr ls`` gives run ``run_id`` (``finished:completed``,
        ``finished:failed``, ...)."""
        proc = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        try:
            rows = json.loads(proc.stdout)["runs"]
            return str(next(r["status"] for r in rows if str(r["run-id"]) == str(run_id)))
        except (ValueError, KeyError, StopIteration):
            raise DeployError(f"flwr ls --run-id {run_id} failed:\n{proc.stdout}{proc.stderr}") \
                from None


def started_run(flwr_run_output: str) -> int | None:
    """The run id in ``flwr run``'s "Successfully started run N" line (``None``: none)."""
    m = re.search(r"Successfully started run (\d+)", flwr_run_output)
    return int(m.group(1)) if m else None


def _session_nice(pid: int, nice: int) -> None:
    """Give the session led by ``pid`` the scheduling niceness ``nice``.

    Under Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
    the CPU is shared between sessions first, and a process's own niceness counts only
    inside its session; every component runs in a session of its own, so its group's
    niceness is what yields the CPU to the SuperLink.  Without autogroup there is no
    such file and the process's own niceness (``nice -n``) is all there is.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass


def run_config_toml(run_config: Mapping[str, object]) -> str:
    """A ``--run-config`` TOML file: one (quoted) dotted key per line, as Flower flattens it."""
    return toml_text(run_config)


def connection_toml(address: str, ca_cert: Path | str | None) -> str:
    """The flwr CLI's ``config.toml``: the connection ``fedsys-local`` to ``address``, over
    TLS with ``ca_cert`` or insecure without one."""
    link: dict[str, object] = {"address": address}
    if ca_cert is None:
        link["insecure"] = True
    else:
        link["root-certificates"] = str(ca_cert)
    return toml_text({"superlink": {"default": CONNECTION, CONNECTION: link}})


# ---------------------------------------------------------------------- /proc helpers


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int:
    f = _stat_fields(pid)
    return int(f[19]) if f else 0


def _same_process(pid: int, start_time: int) -> bool:
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z" and int(f[19]) == start_time


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        f = _stat_fields(int(stat.parent.name))
        if f is not None:
            out[int(stat.parent.name)] = int(f[1])
    return out


def descendants(pid: int) -> list[int]:
    """``pid`` and all processes below it (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _alive(pid: int) -> bool:
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
