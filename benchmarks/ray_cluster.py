"""A short ``fedsys run`` with a Ray cluster of its own against one joining a running cluster.

Work per run: ``fedsys run`` on synthetic data, an MLP, 3 clients, 2 rounds, FedAvg (the
shape of most integration tests).  ``own``: the run starts its private Ray cluster and stops
it, as a user's run does.  ``joined``: ``RAY_ADDRESS`` names a cluster started once
beforehand (:func:`launch.raycluster.ray_cluster`), as the test suite's runs do.  The two
alternate (own, joined, joined, own, ...) so that drift in the machine's load falls on both.

Per run it measures the wall time and the CPU the whole machine spent meanwhile (``user`` +
``system`` from ``/proc/stat``; time of niced processes, e.g. a background experiment at
nice 19, is left out of ``user`` but its ``system`` time is not, so compare the two columns
rather than read them alone).  It prints medians and the ratio joined/own, and the
final test loss of every run, which must be the same to the last digit.  ``--record``
writes the table to ``docs/performance.md``.

Usage::

    python benchmarks/ray_cluster.py [--pairs 3] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402
from launch.raycluster import ray_cluster  # noqa: E402

RUN = ["--set=dataset=synthetic", "--set=model=mlp", "--set=partition=iid",
       "--set=num-clients=3", "--set=clients-per-round=3", "--set=num-server-rounds=2",
       "--set=strategy=fedavg", "--set=seed=7"]


def cpu_seconds() -> float:
    """The machine's non-niced ``user`` plus ``system`` CPU seconds so far."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[1]) + int(fields[3])) / os.sysconf("SC_CLK_TCK")


def one_run(out: Path, name: str, address: str | None) -> tuple[float, float, float]:
    """Wall seconds, machine CPU seconds and final test loss of one ``fedsys run``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env["RAY_ADDRESS"] = address
    c0, t0 = cpu_seconds(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "launch", "run", *RUN,
                           f"--set=output-dir={out}", f"--set=name={name}"],
                          env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if proc.returncode != 0:
        sys.exit(f"ray_cluster: run {name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    recs = [json.loads(line) for line in (out / name / "fedavg" / "metrics.jsonl").open()]
    return wall, cpu, float(recs[-1]["loss"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="runs of each kind (default 3)")
    ap.add_argument("--record", action="store_true", help="write the table to docs/performance.md")
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float, float]]] = {"own": [], "joined": []}
    with tempfile.TemporaryDirectory(prefix="fedsys-rb-") as tmp:
        out = Path(tmp) / "runs"
        c0, t0 = cpu_seconds(), time.perf_counter()
        with ray_cluster(Path(tmp) / "ray") as address:
            start = (time.perf_counter() - t0, cpu_seconds() - c0)
            for i in range(args.pairs):
                order = ("own", "joined") if i % 2 == 0 else ("joined", "own")
                for kind in order:
                    r = one_run(out, f"{kind}-{i}", address if kind == "joined" else None)
                    runs[kind].append(r)
                    print(f"{kind:6s} run {i}: wall {r[0]:5.1f} s, machine CPU {r[1]:5.1f} s, "
                          f"final loss {r[2]!r}", flush=True)
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
           for k, v in runs.items()}
    losses = {r[2] for v in runs.values() for r in v}
    rows = [f"| measure (median of {args.pairs}) | own cluster | joined cluster "
            "| ratio joined/own |", "|---|---:|---:|---:|"]
    for j, label in enumerate(("wall s per run", "machine CPU s per run")):
        rows.append(f"| {label} | {med['own'][j]:.1f} | {med['joined'][j]:.1f} | "
                    f"{med['joined'][j] / med['own'][j]:.2f} |")
    table = "\n".join(rows)
    note = (f"Starting the shared cluster once: {start[0]:.1f} s wall, {start[1]:.1f} s of "
            f"machine CPU. Final test loss of every run: "
            f"{', '.join(repr(a) for a in sorted(losses))} (one value: the same numbers).")
    print(table + "\n\n" + note)
    if len(losses) != 1:
        sys.exit("ray_cluster: the runs' final losses differ")
    if args.record:
        cmd = "python benchmarks/ray_cluster.py " + " ".join(sys.argv[1:])
        body = (f"Command: `{cmd}`  \nMachine: {platform.machine()}, {os.cpu_count()} cores, "
                f"{time.strftime('%Y-%m-%d')}\n\n"
                "A short `fedsys run` (synthetic data, MLP, 3 clients, 2 rounds, FedAvg: the "
                "shape of most integration tests) starting its own Ray cluster, against the "
                "same run joining a running cluster through `RAY_ADDRESS` (what the test suite "
                "does, one cluster per test process), alternating. Machine CPU: non-niced user "
                "plus system time of the whole machine during the run (work running niced "
                "beside it adds its system time to both columns).\n\n"
                + table + "\n\n" + note + "\n")
        doc = ROOT / "docs" / "performance.md"
        doc.write_text(metrics.replace_section(doc.read_text(), "## Ray cluster per run", body))
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
