"""A Ray cluster that outlives single simulations, for runs that join it via ``RAY_ADDRESS``.

``fedsys run`` normally starts a private Ray cluster and stops it at the end: about 4 s of
wall time and 4 s of CPU per run on 2 cores (``benchmarks/ray_cluster.py``).  Many short runs
in a row (the test suite, a benchmark) can instead share one cluster: each run is still a Ray
job of its own, with fresh worker processes, so its numbers do not change
(:func:`fedsys_launch.engines.simulation.ray_init_args` decides which way a run goes).

Usage::

    with ray_cluster(Path("/tmp/r")) as address:
        os.environ["RAY_ADDRESS"] = address  # runs started from here join it
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedsys_launch.process.flower_env import FLWR_ENV
from fedsys_launch.process.supervision import alive, descendants, free_port


@contextmanager
def ray_cluster(root: Path, num_cpus: int | None = None,
                timeout: float = 180.0, worker_ports: tuple[int, int] | None = None,
                attempts: int = 3) -> Iterator[str]:
    """Run ``ray start --head --block`` on 127.0.0.1 while the block runs; its address.

    The cluster gets free ports of its own and its temporary directory under ``root`` (keep
    it short: Ray's socket paths must fit 107 characters), so it is never the cluster that
    ``/tmp/ray`` records for a bare ``ray.init()``.  ``num_cpus`` defaults to every core.
    On leaving, the cluster is stopped and none of its processes is left.
    ``worker_ports`` (first, last) is the range its workers and drivers listen on (Ray's
    default, 10002-19999, is every cluster's: clusters started side by side, such as the
    test workers', would take the same port).  ``ray start`` gives up when its raylet has
    not registered with the GCS after 30 s (fixed in Ray's ``node.py``), which a busy
    machine can reach; such a start is tried again, ``attempts`` times in all, each
    attempt's output kept in ``ray-start.log`` (docs/development.md "Why things are as
    they are").

    Raises
    ------
    RuntimeError
        When no attempt started the cluster within ``timeout`` seconds (with the end of its
        log).
    """
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "ray-start.log"
    log_path.write_bytes(b"")
    for attempt in range(1, attempts + 1):
        proc, port = _start(root, log_path, num_cpus, worker_ports)
        try:
            end = time.monotonic() + timeout
            while b"Ray runtime started" not in log_path.read_bytes():
                gave_up = proc.poll() is not None
                if gave_up and attempt < attempts:
                    break  # (finally stops what is left of it) and the next attempt
                if gave_up or time.monotonic() > end:
                    raise RuntimeError(
                        f"the Ray cluster in {root} did not start (exit status {proc.poll()}, "
                        f"attempt {attempt} of {attempts}):\n"
                        + log_path.read_text(errors="replace")[-3000:])
                time.sleep(0.2)
            else:
                yield f"127.0.0.1:{port}"
                return
        finally:
            _stop(proc)


#: ``ray start`` as its console script runs it, but for the address a joining node is
#: given: Ray replaces 127.0.0.1 there by the machine's network address (a second machine
#: could not reach the head at 127.0.0.1), which a node on this same machine must not
#: leave, so it is kept as given.
_JOIN_ON_LOOPBACK = (
    "import sys; import ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())")


@contextmanager
def ray_node(address: str, root: Path, num_cpus: int = 1, timeout: float = 180.0
             ) -> Iterator[None]:
    """Run ``ray start --address=ADDRESS --block`` on 127.0.0.1 while the block runs: one
    more node of the cluster at ``address`` (a second machine's ``ray start``, here on this
    one), with ``num_cpus`` CPUs and no GPU; its output in ``root/ray-node.log``.  On
    leaving, the node is stopped and none of its processes is left (the cluster goes on).

    Raises
    ------
    RuntimeError
        When the node has not joined within ``timeout`` seconds (with the end of its log).
    """
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "ray-node.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _JOIN_ON_LOOPBACK, "start", f"--address={address}", "--block",
             "--node-ip-address=127.0.0.1",
             f"--num-cpus={num_cpus}", "--num-gpus=0", "--disable-usage-stats",
             f"--dashboard-agent-listen-port={free_port()}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # a node that joins is refused where Ray is told it is not a cluster (FLWR_ENV,
            # which keeps a private cluster on loopback; this node binds 127.0.0.1 anyway)
            env={**FLWR_ENV, **os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"})
    try:
        end = time.monotonic() + timeout
        while b"Ray runtime started" not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the Ray node joining {address} did not start (exit status "
                                   f"{proc.poll()}):\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        yield
    finally:
        _stop(proc)


def _start(root: Path, log_path: Path, num_cpus: int | None,
           worker_ports: tuple[int, int] | None) -> tuple[subprocess.Popen[bytes], int]:
    """``ray start --head --block`` on free ports, its output appended to ``log_path``;
    the process and its GCS port."""
    port = free_port()
    ray = Path(sys.executable).parent / "ray"
    with log_path.open("ab") as log:
        log.write(f"--- ray start on port {port}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={port}", f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}",
             f"--num-cpus={num_cpus or os.cpu_count() or 1}", "--num-gpus=0",
             "--include-dashboard=false", "--disable-usage-stats", "--no-monitor",
             f"--temp-dir={root}",
             *([f"--min-worker-port={worker_ports[0]}", f"--max-worker-port={worker_ports[1]}"]
               if worker_ports else [])],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**FLWR_ENV, **os.environ})  # as simulate(): the caller's values win
    return proc, port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the cluster's process group (``ray start --block`` then stops what it
    started), SIGKILL whatever of it is left after 15 s."""
    pids = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    end = time.monotonic() + 15
    while time.monotonic() < end and any(alive(p) for p in pids if p != proc.pid):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(timeout=15)
