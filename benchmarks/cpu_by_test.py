"""The CPU each test costs, daemons included, from a cpuacct cgroup per pytest worker.

As a pytest plugin (Linux, root, cgroup v1 ``cpuacct`` mounted at
``/sys/fs/cgroup/cpuacct``), every test process moves itself into a cgroup of its own; the
processes it starts (``fedsys run``, Ray clusters and actors, a deployment's SuperLink,
SuperNodes and ClientApps, even detached into their own sessions) stay in it, so the
cgroup's CPU counter read before and after each test (setup, call, teardown) is that test's
CPU, whatever ran beside it on other workers.  A module-scoped fixture's set-up counts
towards the module's first test, its teardown towards the last.  Docker containers are
outside (they belong to the Docker daemon's cgroups).

Usage::

    PYTHONPATH=benchmarks PYTEST_ADDOPTS="-p cpu_by_test" CPU_BY_TEST=/tmp/acct make test
    python benchmarks/cpu_by_test.py /tmp/acct [--top 30]      # per module, per worker, per test
    python benchmarks/cpu_by_test.py /tmp/acct --before /tmp/acct-old   # side by side
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

CGROUPS = Path("/sys/fs/cgroup/cpuacct")
_state: dict[str, Any] = {}


def _usage() -> float:
    return int((_state["cg"] / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config: Any) -> None:
    """Move this process into its worker's cgroup; open its record file."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main" and getattr(config.option, "numprocesses", None):
        return  # the xdist controller: it hears of every test but runs none
    cg = CGROUPS / f"cpu-by-test-{os.getpid()}-{worker}"
    cg.mkdir(exist_ok=True)
    (cg / "cgroup.procs").write_text(str(os.getpid()))
    out = Path(os.environ.get("CPU_BY_TEST", "cpu-by-test"))
    out.mkdir(parents=True, exist_ok=True)
    _state["cg"] = cg
    _state["worker"] = worker
    _state["file"] = (out / f"{worker}-{os.getpid()}.jsonl").open("a")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """The counters at a test's start."""
    if "cg" not in _state:
        return
    _state["start"] = (_usage(), time.monotonic())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    """One record per test: its CPU and wall seconds (the xdist controller keeps none)."""
    if "start" not in _state or "cg" not in _state:
        return
    cpu0, wall0 = _state["start"]
    f: TextIO = _state["file"]
    f.write(json.dumps({"test": nodeid, "worker": _state["worker"], "cpu": _usage() - cpu0,
                        "wall": time.monotonic() - wall0}) + "\n")
    f.flush()


def load(directory: Path) -> list[dict[str, Any]]:
    """The records of one measured run (the xdist workers'; the controller's, which only
    relays the workers' tests, left out when there are workers)."""
    files = sorted(directory.glob("*.jsonl"))
    workers = [f for f in files if f.name.startswith("gw")]
    return [json.loads(line) for f in (workers or files) for line in f.read_text().splitlines()]


def by_module(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float, int]]:
    """Module -> (CPU s, wall s, tests)."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = out[r["test"].split("::")[0]]
        m[0] += r["cpu"]
        m[1] += r["wall"]
        m[2] += 1
    return {k: (v[0], v[1], int(v[2])) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="the records of a run (CPU_BY_TEST)")
    ap.add_argument("--before", type=Path, help="an earlier run's records, shown beside")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = load(args.dir)
    now = by_module(rows)
    old = by_module(load(args.before)) if args.before else {}
    total = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} s of CPU" + (
        f" (before: {sum(v[0] for v in old.values()):.0f} s)" if old else ""))
    head = "| module | tests | CPU s | wall s |" + (" CPU s before |" if old else "")
    print(head)
    print("|---|---:|---:|---:|" + ("---:|" if old else ""))
    for m, (cpu, wall, n) in sorted(now.items(), key=lambda kv: -kv[1][0])[: args.top]:
        extra = f" {old[m][0]:.0f} |" if m in old else (" |" if old else "")
        print(f"| {m.removeprefix('tests/')} | {n} | {cpu:.0f} | {wall:.0f} |{extra}")
    workers: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        workers[r.get("worker", "?")][0] += r["cpu"]
        workers[r.get("worker", "?")][1] += r["wall"]
    print("\nper worker: " + ", ".join(f"{w} {c:.0f} s CPU in {t:.0f} s"
                                       for w, (c, t) in sorted(workers.items())))


if __name__ == "__main__":
    main()
