"""Round time of the two simulation engines side by side: ``engine: flower`` (Flower's
simulation engine: Ray actors behind an in-process SuperLink) and ``engine: inprocess``
(fedsys's own Grid, every ClientApp called in the run's process).

Each pair runs ``fedsys run CONFIG --set num-server-rounds=R`` once per engine, one after
the other, each in a fresh process as a user runs it.  It prints, per strategy, the mean
``round-time`` (the run's own per-round wall clock; a chain's round is a hop) of rounds 2
to R (round 1 also starts Flower's actors), and the whole command's wall time and CPU time
(every process of its process group: the driver and the Ray processes), medians over the
pairs, with the ratio flower/inprocess.  Both engines' run trees stay under
``OUT/<engine>-<pair>/``: ``python scripts/metrics_identical.py OUT/flower-1
OUT/inprocess-1`` compares their numbers and final models bit for bit.

Usage (``--set`` overrides a key for both engines; ``configs/default.yaml`` at 3 rounds
needs its FedCDA warmup of 5 rounds made 1, as ``--default-at-3`` does)::

    python benchmarks/engines.py configs/default.yaml --rounds 3 --default-at-3 --out /tmp/engines
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("flower", "inprocess")
#: ``configs/default.yaml``'s strategies with FedCDA's warmup 1, not 5 (a run refuses a
#: warmup that covers it: at 3 rounds FedCDA would never select)
DEFAULT_AT_3 = ("strategy=fedavg,fedprox,fedcda[fedcda.warmup=1] as fedcda,fedcross,"
                "ima[ima.base=fedavg;ima.start-fraction=0.6] as fedavg+ima,"
                "fedelmy[lr=0.001;batch-size=64;fedelmy.pool-size=3] as fedelmy,"
                "fedseq[lr=0.001;batch-size=64] as fedseq,"
                "fedavg[trainer=lss;lr=0.0005;batch-size=64;lss.ingredients=2] as fedavg+lss")


def group_cpu(pgid: int, seen: dict[int, float]) -> None:
    """Record in ``seen`` the CPU seconds (user + system) so far of every process of
    process group ``pgid`` (a run's driver and the Ray processes it starts)."""
    tick = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ..., utime, stime
            seen[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick


def run_once(config: Path, engine: str, rounds: int, out: Path, sets: list[str]
             ) -> tuple[float, float]:
    """Wall seconds and CPU seconds (the run's process group, sampled every 0.5 s) of one
    ``fedsys run`` of ``config`` on ``engine`` (results in ``out``; ``sets``: more
    ``KEY=VALUE`` overrides)."""
    cmd = [sys.executable, "-m", "fedsys_launch", "run", str(config), *(f"--set={s}" for s in sets),
           f"--set=num-server-rounds={rounds}", f"--set=engine={engine}",
           f"--set=output-dir={out}", f"--set=name={config.stem}"]
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[int, float] = {}
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        while proc.poll() is None:
            group_cpu(proc.pid, seen)
            time.sleep(0.5)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{engine} run failed (exit {proc.returncode}): see {out / 'log.txt'}")
    return wall, sum(seen.values())


def round_times(run_dir: Path) -> dict[str, float]:
    """Each strategy's mean ``round-time`` over its rounds 2.. (round 1 where it has one)."""
    out = {}
    for f in sorted(run_dir.glob("*/metrics.jsonl")):
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        times = [float(r["round-time"]) for r in recs if int(r["round"]) >= 1]
        out[f.parent.name] = statistics.fmean(times[1:] or times)
    return out


def table(rows: dict[str, dict[str, float]], walls: dict[str, float],
          cpus: dict[str, float]) -> str:
    """The markdown table: per strategy and for the whole command (wall and CPU), both
    engines and the ratio flower/inprocess."""
    lines = ["| strategy (round-time, rounds 2..) | flower s | inprocess s | flower/inprocess |",
             "|---|---:|---:|---:|"]
    for name in rows["flower"]:
        a, b = rows["flower"][name], rows["inprocess"].get(name, float("nan"))
        lines.append(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.1f} |")
    a, b = walls["flower"], walls["inprocess"]
    lines.append(f"| **whole command, wall** (start-up included) | {a:.1f} | {b:.1f} | {a / b:.1f} |")
    a, b = cpus["flower"], cpus["inprocess"]
    lines.append(f"| **whole command, CPU** (every process of the run) | {a:.1f} | {b:.1f} "
                 f"| {a / b:.1f} |")
    return "\n".join(lines)


def main() -> None:
    """Run the pairs, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("config", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fedsys-engines"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for both engines (repeatable)")
    ap.add_argument("--default-at-3", action="store_true",
                    help="configs/default.yaml's strategies with FedCDA's warmup 1 (DEFAULT_AT_3)")
    args = ap.parse_args()
    config = args.config.resolve()
    sets = [*args.set, *([DEFAULT_AT_3] if args.default_at_3 else [])]
    per: dict[str, list[dict[str, float]]] = {e: [] for e in ENGINES}
    wall: dict[str, list[float]] = {e: [] for e in ENGINES}
    cpu: dict[str, list[float]] = {e: [] for e in ENGINES}
    for k in range(1, args.pairs + 1):
        for engine in ENGINES:
            out = args.out.resolve() / f"{engine}-{k}"
            w, c = run_once(config, engine, args.rounds, out, sets)
            wall[engine].append(w)
            cpu[engine].append(c)
            per[engine].append(round_times(out / config.stem))
            print(f"pair {k} {engine}: {w:.1f} s wall, {c:.1f} s CPU", flush=True)
    rows = {e: {name: statistics.median(p[name] for p in per[e]) for name in per[e][0]}
            for e in ENGINES}
    print(table(rows, {e: statistics.median(wall[e]) for e in ENGINES},
                {e: statistics.median(cpu[e]) for e in ENGINES}))


if __name__ == "__main__":
    main()
