"""A short ``fedsys run`` with a Ray cluster of its own against one joining a running cluster.

Work per run: ``fedsys run`` on synthetic data, an MLP, 3 clients, 2 rounds, FedAvg (the
shape of most integration tests).  Three kinds, alternating so that drift in the machine's
load falls on all of them:

* ``own``: the run starts its private Ray cluster and stops it, as a user's run does;
* ``joined``: ``RAY_ADDRESS`` names a cluster with every core, started once beforehand
  (:func:`fedsys_launch.engines.shared_ray_cluster.ray_cluster`);
* ``joined-1cpu``: the same with a one-CPU cluster, as the test suite's runs do: Flower
  starts one ClientApp actor per CPU of the cluster, so these runs start one.

Per run it measures the wall time and the CPU time of every process on the machine that
runs below nice 19, sampled from ``/proc`` every 0.2 s, so the Ray workers (which Ray runs
at nice 15) count and a background experiment at nice 19 does not.  An earlier version
read ``/proc/stat``'s ``user`` + ``system``, which leaves every niced process out: it
missed the actors.  It prints medians, the ratios to ``own``, and the final test loss of
every run, which must be the same to the last digit.  ``--record`` writes the table to
``docs/performance.md``.

Usage::

    python benchmarks/ray_cluster.py [--pairs 3] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys_launch import recording  # noqa: E402
from fedsys_launch.engines.shared_ray_cluster import ray_cluster  # noqa: E402

RUN = ["--set=dataset=synthetic", "--set=model=mlp", "--set=partition=iid",
       "--set=num-clients=3", "--set=clients-per-round=3", "--set=num-server-rounds=2",
       "--set=strategy=fedavg", "--set=seed=7"]


def process_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of every process below nice 19, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[16]) < 19:
                out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_during(proc: subprocess.Popen[str]) -> float:
    """CPU seconds the machine's processes below nice 19 spent until ``proc`` ended."""
    before = process_cpu()
    last = dict(before)
    while proc.poll() is None:
        last.update(process_cpu())
        time.sleep(0.2)
    time.sleep(1.0)  # the Ray job's workers wind down
    last.update(process_cpu())
    return sum(v - before.get(pid, 0.0) for pid, v in last.items())


def one_run(out: Path, name: str, address: str | None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and final test loss of one ``fedsys run``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env["RAY_ADDRESS"] = address
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fedsys_launch", "run", *RUN,
                                 f"--set=output-dir={out}", f"--set=name={name}"],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        cpu = _cpu_during(proc)
        wall = time.perf_counter() - t0 - 1.0
        if proc.returncode != 0:
            log.seek(0)
            sys.exit(f"ray_cluster: run {name} failed:\n{log.read()[-3000:]}")
    recs = [json.loads(line) for line in (out / name / "fedavg" / "metrics.jsonl").open()]
    return wall, cpu, float(recs[-1]["loss"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="runs of each kind (default 3)")
    ap.add_argument("--record", action="store_true", help="write the table to docs/performance.md")
    args = ap.parse_args()
    kinds = ("own", "joined", "joined-1cpu")
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="fedsys-rb-") as tmp:
        out = Path(tmp) / "runs"
        with ray_cluster(Path(tmp) / "ray") as every_core, \
                ray_cluster(Path(tmp) / "ray1", num_cpus=1) as one_cpu:
            address = {"own": None, "joined": every_core, "joined-1cpu": one_cpu}
            for i in range(args.pairs):
                for kind in kinds[i % 3:] + kinds[:i % 3]:
                    r = one_run(out, f"{kind}-{i}", address[kind])
                    runs[kind].append(r)
                    print(f"{kind:11s} run {i}: wall {r[0]:5.1f} s, CPU {r[1]:5.1f} s, "
                          f"final loss {r[2]!r}", flush=True)
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
           for k, v in runs.items()}
    losses = {r[2] for v in runs.values() for r in v}
    rows = [f"| measure (median of {args.pairs}) | own cluster | joined, every core "
            "| joined, 1 CPU | ratios to own |", "|---|---:|---:|---:|---:|"]
    for j, label in enumerate(("wall s per run", "CPU s per run")):
        rows.append(f"| {label} | {med['own'][j]:.1f} | {med['joined'][j]:.1f} | "
                    f"{med['joined-1cpu'][j]:.1f} | {med['joined'][j] / med['own'][j]:.2f}, "
                    f"{med['joined-1cpu'][j] / med['own'][j]:.2f} |")
    table = "\n".join(rows)
    note = (f"Final test loss of every run: {', '.join(repr(a) for a in sorted(losses))} "
            "(one value: the same numbers).")
    print(table + "\n\n" + note)
    if len(losses) != 1:
        sys.exit("ray_cluster: the runs' final losses differ")
    if args.record:
        cmd = "python benchmarks/ray_cluster.py " + " ".join(sys.argv[1:])
        body = ("A short `fedsys run` (synthetic data, MLP, 3 clients, 2 rounds, FedAvg: the "
                "shape of most integration tests) starting its own Ray cluster, against the "
                "same run joining a running cluster through `RAY_ADDRESS`, with every core or "
                "with one CPU (what the test suite does, one cluster per test process; Flower "
                "starts one ClientApp actor per CPU), alternating. CPU: user plus system time "
                "of every process below nice 19, sampled from /proc (Ray runs its workers at "
                "nice 15; a background experiment at nice 19 is left out). This replaces a "
                "first version of the table that read /proc/stat's non-niced time and so "
                "missed the actors (it gave 16.7 and 10.5 s).\n\n"
                + table + "\n\n" + note + "\n")
        doc = ROOT / "docs" / "performance.md"
        recording.record_section(doc, "## Ray cluster per run", cmd, body)
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
