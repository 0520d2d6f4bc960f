"""Network namespaces of a test's own, joined by a bridge that exists only between them.

Every namespace gets one address of 198.51.100.0/24 (TEST-NET-2, RFC 5737) on a veth
whose other end sits on a bridge in a namespace of its own; no namespace has a default
route, so every packet stays among the namespaces this object made.  ``ip netns exec``
mounts ``/etc/netns/NAME/hosts`` over ``/etc/hosts`` in a namespace, which is how a host
name resolves to the server's address there.  :meth:`Netns.remove` deletes all of it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

NET = "198.51.100"


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if not shutil.which("ip"):
        return "the ip command is missing (apt-get install iproute2)"
    probe = f"fsprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class Netns:
    """Namespaces ``PREFIX-NAME`` on one bridge (see the module docstring)."""

    def __init__(self, hosts: Mapping[str, str] | None = None) -> None:
        self.tag = f"fs{os.getpid() % 100000}"
        self.bridge = f"{self.tag}-br"
        self.addresses: dict[str, str] = {}
        self.hosts = dict(hosts or {})  # host name -> address, in every namespace
        self.procs: list[subprocess.Popen[Any]] = []
        _ip("netns", "add", self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def port(self, name: str) -> str:
        """The bridge's end of ``name``'s link (``link_down`` cuts it)."""
        return f"b{self.tag[2:]}{name}"[:15]

    def add(self, name: str, host: int) -> str:
        """Namespace ``name`` with address 198.51.100.HOST on the bridge; its address."""
        ns, addr = self.ns(name), f"{NET}.{host}"
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        inner = f"v{self.tag[2:]}{name}"[:15]
        _ip("link", "add", inner, "type", "veth", "peer", "name", self.port(name),
            "netns", self.bridge)
        _ip("link", "set", inner, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", self.bridge, "link", "set", self.port(name), "master", "br0", "up")
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for h, a in self.hosts.items()))
        self.addresses[name] = addr
        return addr

    def link(self, name: str, up: bool) -> None:
        """Cut (or restore) ``name``'s link to the bridge, as a failed uplink would."""
        _ip("-n", self.bridge, "link", "set", self.port(name), "up" if up else "down")

    def argv(self, name: str, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *args]

    def run(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in namespace ``name`` to the end (not checked)."""
        return subprocess.run(self.argv(name, args), env=dict(env or os.environ), cwd=cwd,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def start(self, name: str, args: Sequence[str], log: IO[Any],
              env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
        """Start ``args`` in namespace ``name`` in a session of its own (stopped by
        :meth:`stop` or :meth:`remove`)."""
        proc = subprocess.Popen(self.argv(name, args), env=dict(env or os.environ),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
        """SIGTERM the process's session (its start script stops what it started), then
        SIGKILL what is left."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(wait)
                end = time.monotonic() + 5  # the session's other members
                while _session_alive(proc.pid) and time.monotonic() < end:
                    time.sleep(0.1)
                if not _session_alive(proc.pid):
                    return
            except subprocess.TimeoutExpired:
                continue

    def remove(self) -> None:
        """Stop every process started here and delete the namespaces and their files."""
        for proc in self.procs:
            self.stop(proc)
        for name in [*self.addresses, None]:
            ns = self.ns(name) if name else self.bridge
            # a process still in the namespace would keep it (and its links) alive
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True, check=False).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Namespaces of this object still present (none after :meth:`remove`)."""
        have = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                              check=False).stdout.split()
        return [n for n in have if n.startswith(f"{self.tag}-")]


def _session_alive(sid: int) -> bool:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6: the session id
            return True
    return False
