"""A real Flower deployment as local processes on 127.0.0.1.

One SuperLink and N SuperNodes, each with its own ``FLWR_HOME`` (as if on separate
machines), started from a neutral directory and stopped by PID.  ``flwr run`` then
submits the fedsys app to it.  Used by the deployment tests and by operators who
want to try the deployment path without Docker.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedsys.simulation import FLWR_ENV

HOST = "127.0.0.1"


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
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


@dataclass
class LocalDeployment:
    """SuperLink + SuperNodes as processes, all state under ``root``."""

    root: Path
    num_nodes: int = 2
    data_dir: str = ""
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, **FLWR_ENV, "PATH": path}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"{name}.log").open("wb")
        p = subprocess.Popen(args, cwd=home, env={**self.env, "FLWR_HOME": str(home)},
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        (self.root / f"{name}.pid").write_text(str(p.pid))
        return p

    def start_superlink(self) -> None:
        self._spawn("superlink", [_bin("flower-superlink"), "--insecure",
                                  "--disable-runtime-dependency-installation",
                                  "--host", HOST, "--port", str(self.port)])
        wait_port(self.port)

    def start_supernode(self, i: int) -> None:
        cfg = f"partition-id={i} num-partitions={self.num_nodes}"
        if self.data_dir:
            cfg += f' data-dir="{self.data_dir}"'
        self._spawn(f"node{i}", [_bin("flower-supernode"), "--insecure",
                                 "--superlink", f"{HOST}:{self.port}",
                                 "--port", str(free_port()), "--node-config", cfg])

    def up(self) -> None:
        """Start the SuperLink, then the SuperNodes, and register the CLI connection."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.start_superlink()
        for i in range(self.num_nodes):
            self.start_supernode(i)
        cli = self.root / "cli"
        cli.mkdir(exist_ok=True)
        (cli / "config.toml").write_text(
            '[superlink]\ndefault = "fedsys-local"\n\n'
            f'[superlink.fedsys-local]\naddress = "{HOST}:{self.port}"\ninsecure = true\n'
        )

    def flwr_run(self, app_dir: Path, run_config: dict[str, object], timeout: float = 600) -> str:
        """``flwr run APP fedsys-local --stream``; returns its output."""
        rc = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
        cli = self.root / "cli"
        proc = subprocess.run(
            [_bin("flwr"), "run", str(app_dir), "fedsys-local", "--stream", "--run-config", rc],
            cwd=cli, env={**self.env, "FLWR_HOME": str(cli)}, capture_output=True,
            text=True, timeout=timeout, check=False,
        )
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run failed (exit {proc.returncode}):\n{out[-3000:]}")
        return out

    def all_pids(self) -> list[int]:
        """PIDs of every component and of all their descendants (Flower detaches
        its SuperExec children into their own sessions, so process groups are not
        enough)."""
        return sorted({d for p in self.procs.values() for d in descendants(p.pid)})

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one component and its descendants."""
        p = self.procs.pop(name, None)
        if p is not None:
            _signal_all(descendants(p.pid), sig)
            p.wait(timeout=30)

    def down(self) -> None:
        """Stop every process and its descendants (SIGTERM, then SIGKILL)."""
        pids = self.all_pids()
        _signal_all(pids, signal.SIGTERM)
        end = time.monotonic() + 15
        while time.monotonic() < end and any(_alive(p) for p in pids):
            for p in self.procs.values():
                p.poll()
            time.sleep(0.2)
        _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)
        for p in self.procs.values():
            p.wait(timeout=10)
        self.procs.clear()


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        out[int(stat.parent.name)] = int(fields[1])
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
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return "'" + str(v) + "'"
