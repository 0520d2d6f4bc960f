"""Limits at the sites' port (issue 75, item 3), proven on a real deployment on 127.0.0.1.

``fedsys deploy up --nodes 2 --tls --auth``; then, from another address than the sites
(``127.0.0.2``: Linux routes all of 127/8 to the loopback, so the proxy's per-address
limits tell the attacker from the real sites on ``127.0.0.1``), with nothing but
``ca.crt``:

* one ``POST /v1/fleet/push-object`` with a 1 GiB chunked body, streamed from a generator
  of one 1 MiB block (before the limits, the SuperLink read every byte of it: a 400 MB
  body grew it by 784 MB);
* 1,000 slow connections held open, reopened as they are refused or cut, half of them
  slow POSTs (the whole header, then a byte of the body every 3 s: 511 of them took the
  one nginx worker before), half slow headers (a header line every 3 s);

and, while those 1,000 are held, a real run of the two sites (one FedAvg round).  The
SuperLink's resident memory (``/proc/PID/status`` of the ``superlink`` pid in
``deploy.json``) may grow by less than 64 MiB during the attacks, and the run must
complete.  The figures it prints are the ones in docs/performance.md ("Limits at the
sites' port").  Mutation-checked: with ``client_max_body_size 0``,
``proxy_request_buffering off`` and one worker of 1,024 connections (the configuration
before) the bound fails (see the commit).
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from fedsys_launch.deploy.local_deployment import STATE_FILE, SUPERLINK, LocalDeployment
from fedsys_launch.deploy.proxy import MiB
from fedsys_launch.process.supervision import alive

if TYPE_CHECKING:
    from conftest import FedsysCLI

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

NODES = 2
ATTACKER = "127.0.0.2"
BODY = 1 << 30         #: the large body, streamed
SLOW = 1000            #: slow connections held at once
TRICKLE = 3.0          #: seconds between the bytes of a slow connection
REOPEN = 5.0           #: seconds before a refused or cut slow connection is opened again
GROWTH = 64 * MiB      #: what the attacks may cost the SuperLink


@pytest.fixture(scope="module", name="runs")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the site's run writes: the deployment's only root, apart from its directory."""
    return tmp_path_factory.mktemp("limits-runs")


@pytest.fixture(scope="module", name="dep")
def limited_dep(tmp_path_factory: pytest.TempPathFactory, runs: Path,
                module_fedsys_cli: FedsysCLI) -> Iterator[LocalDeployment]:
    """``fedsys deploy up --nodes 2 --tls --auth``, and ``down`` after the module."""
    root = tmp_path_factory.mktemp("limits") / "deploy"
    up = module_fedsys_cli.run("deploy", "up", "--nodes", str(NODES), "--tls", "--auth",
                               "--dir", str(root), "--roots", str(runs))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        dep = LocalDeployment.load(root)
        pids = dep.all_pids()
        yield dep
    finally:
        if (root / STATE_FILE).exists():
            pids = sorted(set(pids) | set(LocalDeployment.load(root).all_pids()))
        down = module_fedsys_cli.run("deploy", "down", "--dir", str(root))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [p for p in pids if alive(p)], "processes left running after down"


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class Sampler:
    """The SuperLink's VmRSS every 0.1 s, in a thread: its peak since :meth:`mark`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, _status_kb(pid, "VmRSS")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, _status_kb(self.pid, "VmRSS"))

    def mark(self) -> int:
        """The peak so far, and start a new one."""
        peak, self.peak = self.peak, _status_kb(self.pid, "VmRSS")
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _tls(dep: LocalDeployment) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(dep.ca_cert))
    return ctx


def _head(length: int | None) -> bytes:
    size = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return (f"POST /v1/fleet/push-object HTTP/1.1\r\nhost: localhost\r\n{size}\r\n"
            "content-type: application/protobuf\r\n\r\n").encode()


def _blocks(total: int, block: bytes) -> Iterator[bytes]:
    """``total`` bytes as chunked-encoding frames of one reused ``block``."""
    frame = b"%x\r\n" % len(block)
    for _ in range(total // len(block)):
        yield frame
        yield block
        yield b"\r\n"
    yield b"0\r\n\r\n"


def large_body(dep: LocalDeployment, total: int = BODY,
               deadline: float = 180.0) -> dict[str, object]:
    """POST ``total`` bytes of chunked body from the attacker's address; stop at the
    proxy's answer or when it closes.  What the attacker saw."""
    sent, head, t0 = 0, None, time.monotonic()
    raw = socket.create_connection(("127.0.0.1", dep.port), 30, source_address=(ATTACKER, 0))
    with _tls(dep).wrap_socket(raw, server_hostname="localhost") as s:
        try:
            s.sendall(_head(None))
            for piece in _blocks(total, bytes(MiB)):
                s.sendall(piece)
                sent += len(piece)
                if time.monotonic() - t0 > deadline:
                    break
                if select.select([s], [], [], 0)[0]:  # an answer, or a TLS session ticket
                    s.setblocking(False)
                    try:
                        head = s.recv(256)
                        break
                    except ssl.SSLWantReadError:
                        pass
                    finally:
                        s.setblocking(True)
            if head is None:  # the old proxy: the SuperLink answers once it read it all
                s.settimeout(120)
                head = s.recv(256)
            status = head.split(b"\r\n")[0].decode() if head else "connection closed"
        except (ConnectionError, ssl.SSLError, TimeoutError) as e:
            status = f"connection closed ({type(e).__name__})"
    return {"status": status, "sent_mib": round(sent / MiB, 1),
            "seconds": round(time.monotonic() - t0, 1)}


class Flood:
    """``SLOW`` slow connections from the attacker's address, each opened again
    ``REOPEN`` s after it is refused or cut, until :meth:`stop`; every socket is closed
    when it returns.  ``seen`` counts how each attempt ended."""

    def __init__(self, dep: LocalDeployment) -> None:
        self.dep, self.ctx = dep, _tls(dep)
        self.seen: Counter[str] = Counter()
        self.open = 0
        self.peak_open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        assert not self._thread.is_alive(), "the flood did not stop"

    async def _main(self) -> None:
        await asyncio.gather(*(self._one(i) for i in range(SLOW)))

    async def _one(self, i: int) -> None:
        await asyncio.sleep(i * 0.005)  # 1,000 handshakes over 5 s
        for _ in range(1000):  # bounded: at most one attempt every REOPEN s anyway
            if self._stop.is_set():
                return
            self.seen[await self._attempt(i)] += 1
            for _ in range(int(REOPEN * 10)):
                if self._stop.is_set():
                    return
                await asyncio.sleep(0.1)

    async def _attempt(self, i: int) -> str:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", self.dep.port, ssl=self.ctx, server_hostname="localhost",
                local_addr=(ATTACKER, 0)), 30)
        except (OSError, TimeoutError) as e:
            return f"connect failed ({type(e).__name__})"
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        try:
            if i % 2 == 0:  # a slow POST: the whole header, then a byte at a time
                w.write(_head(MiB))
            else:           # slow headers
                w.write(b"POST /v1/fleet/push-object HTTP/1.1\r\nhost: localhost\r\n")
            while not self._stop.is_set():
                try:
                    data = await asyncio.wait_for(r.read(64), TRICKLE)
                except TimeoutError:
                    w.write(b"\0" if i % 2 == 0 else b"x-slow: 1\r\n")
                    continue
                if not data:
                    return "closed by the proxy"
                return data.split(b"\r\n")[0].decode(errors="replace")
            return "held to the end"
        except (ConnectionError, ssl.SSLError) as e:
            return f"closed by the proxy ({type(e).__name__})"
        finally:
            self.open -= 1
            w.close()
            try:
                await asyncio.wait_for(w.wait_closed(), 5)
            except (OSError, TimeoutError, ssl.SSLError):
                pass


def test_the_sites_port_holds_against_one_address(dep: LocalDeployment, runs: Path,
                                                  fedsys_cli: FedsysCLI) -> None:
    pid = dep.components[SUPERLINK].pid
    before, hwm_before = _status_kb(pid, "VmRSS"), _status_kb(pid, "VmHWM")
    sampler = Sampler(pid)
    flood = Flood(dep)
    figures: dict[str, object] = {"rss_before_mib": round(before / MiB, 1)}
    t0 = time.monotonic()
    try:
        figures["large_body"] = large_body(dep)
        body_peak = sampler.mark()
        t0 = time.monotonic()
        flood.start()
        time.sleep(8)  # every slow connection opened (over 5 s) and answered
        flood_peak = sampler.mark()
        figures["rss_peak_large_body_mib"] = round(body_peak / MiB, 1)
        figures["rss_peak_flood_alone_mib"] = round(flood_peak / MiB, 1)
        cfg = runs / "site-round.yaml"
        cfg.write_text(yaml.safe_dump({
            "name": "under-flood", "output-dir": str(runs), "strategy": "fedavg",
            "dataset": "synthetic", "model": "mlp", "num-clients": NODES,
            "clients-per-round": NODES, "min-available-clients": NODES,
            "num-server-rounds": 1, "local-steps": 5, "round-timeout": 300,
            "node-wait-timeout": 300}))  # a busy CI machine: as test_deploy_tls
        r0 = time.monotonic()
        run = fedsys_cli.run("deploy", "run", str(cfg), "--dir", str(dep.root),
                             "--timeout", "420", timeout=480)
        figures["site_run_seconds"] = round(time.monotonic() - r0, 1)
        figures["site_run_exit"] = run.returncode
        figures["slow_connections_open_at_most"] = flood.peak_open
    finally:
        flood.stop()
        figures["flood_seconds"] = round(time.monotonic() - t0, 1)
        figures["flood_attempts"] = dict(flood.seen.most_common())
        figures["rss_peak_during_site_run_mib"] = round(sampler.mark() / MiB, 1)
        sampler.stop()
        figures["rss_after_mib"] = round(_status_kb(pid, "VmRSS") / MiB, 1)
        figures["hwm_before_mib"] = round(hwm_before / MiB, 1)
        figures["hwm_after_mib"] = round(_status_kb(pid, "VmHWM") / MiB, 1)
        print("\nlimits:", json.dumps(figures, indent=1))
    growth = max(body_peak, flood_peak) - before
    assert growth < GROWTH and run.returncode == 0, (
        f"the SuperLink grew {growth / MiB:.1f} MiB under the attacks (bound "
        f"{GROWTH / MiB:.0f}); the site's run exited {run.returncode}:\n"
        f"{run.stdout[-2000:]}{run.stderr[-2000:]}\n{figures}")
    assert "results:" in run.stdout, run.stdout[-2000:]
    # the attacker was refused, not served: 413 at the cap, 503 beyond its quota
    body = figures["large_body"]
    assert isinstance(body, dict)
    assert "413" in str(body["status"]) or "closed" in str(body["status"]), figures
    assert float(body["sent_mib"]) < 64, figures
    assert sum(n for k, n in flood.seen.items() if "503" in k) >= SLOW // 2, figures
