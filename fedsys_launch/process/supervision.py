"""Local processes followed through Linux's ``/proc``: a process and all below it, whether
it is still the one started (PID and kernel start time), signals to many at once, a
session's scheduling niceness; and the loopback ports they listen on."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

HOST = "127.0.0.1"


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


def session_nice(pid: int, nice: int) -> None:
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


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int:
    """The kernel start time of ``pid`` (0: none such)."""
    f = _stat_fields(pid)
    return int(f[19]) if f else 0


def same_process(pid: int, start_time: int) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``start_time``."""
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


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is no zombie)."""
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
