"""What the simulation's patch of Flower buys: ``prompt-dispatch`` (``fedsys_launch.flower_patches``)
on against off (``FEDSYS_FLOWER_PATCHES=prompt-dispatch``), the same run otherwise.

Each arm is one ``fedsys run`` on Flower's engine (synthetic data, the MLP, ``--clients``
clients all trained every round, ``--rounds`` rounds, one local step at batch 32), in its
own process; arms alternate, ``--pairs`` times.  Measured: the median round time of rounds
2 and on (``round-time`` in metrics.jsonl: the round's messages, training and aggregation;
round 1 pays the actors' start).  Checked: both arms end with the same metrics, bit for bit
(the patch changes when a message is taken, never what it holds).

The deployment's patches are measured by their own benchmarks, each against Flower's own
behaviour: ``warm-app-processes`` by ``benchmarks/warm_start.py`` (``FEDSYS_APP_PRELOAD``
empty is the patch off), the start windows and the busy timeout by
``benchmarks/deploy_load.py`` (docs/performance.md, "Deployment load").

Usage::

    python benchmarks/flower_patches.py [--pairs 3] [--rounds 8] [--clients 10] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys_launch import recording  # noqa: E402


def arm(tmp: Path, on: bool, rounds: int, clients: int, tag: str) -> list[dict[str, float]]:
    """One run; its fedavg records."""
    env = {**os.environ, "FEDSYS_FLOWER_PATCHES": "" if on else "prompt-dispatch"}
    sets = {"dataset": "synthetic", "model": "mlp", "num-clients": clients,
            "clients-per-round": clients, "num-server-rounds": rounds, "strategy": "fedavg",
            "engine": "flower", "local-epochs": 1, "batch-size": 32,
            "output-dir": str(tmp), "name": tag, "query-partitions": "false"}
    cmd = [sys.executable, "-m", "fedsys_launch", "run"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=1800)
    lines = (tmp / tag / "fedavg" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--record", action="store_true", help="write docs/performance.md")
    args = ap.parse_args()
    rows: dict[bool, list[float]] = {True: [], False: []}
    finals: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="fedsys-patches-") as t:
        for i in range(args.pairs):
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                recs = arm(Path(t), on, args.rounds, args.clients, f"{'on' if on else 'off'}-{i}")
                times = [r["round-time"] for r in recs if r.get("round", 0) >= 2]
                rows[on].append(statistics.median(times))
                finals[on].append({k: v for k, v in recs[-1].items()
                                   if k not in ("round-time",) and isinstance(v, int | float)})
                print(f"pair {i + 1} {'on ' if on else 'off'}: median round {rows[on][-1]:.3f} s",
                      flush=True)
    same = all(a == b for a, b in zip(finals[True], finals[False], strict=True))
    on_s, off_s = statistics.median(rows[True]), statistics.median(rows[False])
    table = ("| median of the pairs | off (Flower's loop) | on (prompt-dispatch) | on/off |\n"
             "|---|---:|---:|---:|\n"
             f"| round s (rounds 2-{args.rounds}) | {off_s:.3f} | {on_s:.3f} | {on_s / off_s:.2f} |\n"
             f"| per pair, on | | {', '.join(f'{x:.3f}' for x in rows[True])} | |\n"
             f"| per pair, off | {', '.join(f'{x:.3f}' for x in rows[False])} | | |\n")
    print(table)
    print("same final metrics in both arms:", same)
    if not same:
        raise SystemExit("the arms' final metrics differ")
    if args.record:
        cmd = " ".join(["python benchmarks/flower_patches.py",
                        *(x for x in sys.argv[1:] if x != "--record")])
        recording.write_subsection(
            ROOT / "docs" / "performance.md", "## What each patch of Flower buys",
            "### `prompt-dispatch`, on against off", recording.stamp(cmd) + table
            + "\nBoth arms ended with the same metrics, bit for bit.\n")

if __name__ == "__main__":
    main()
