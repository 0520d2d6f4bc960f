"""Clients trained together against Flower's engine, on seeds: do they end within noise?

Runs ``fedsys run CONFIG --seeds S`` twice, each a fresh process as a user starts it:
``engine=flower`` and ``engine=inprocess`` with ``batch-clients=true`` (the round's clients
trained together, ``clients/batched.py``; the same numbers as one at a time to float
rounding, not to the bit).  For every strategy it prints each seed's final and last-5-round
mean accuracy on both, the paired per-seed differences (batched − flower) and the verdict
of :func:`fedsys.metrics.verdict` on them: "within noise" is what the batched engine must
show (a gain or a loss the seeds separate from 0 would mean it trains differently).

Usage (``configs/default.yaml``'s parallel methods: the chains train one client at a time
on both engines)::

    python benchmarks/batched_verdict.py configs/default.yaml --seeds 0,1,2 \\
        --set "strategy=fedavg,fedprox,fedcda[fedcda.warmup=5] as fedcda,fedcross,ima[ima.base=fedavg;ima.start-fraction=0.6] as fedavg+ima" \\
        --out /tmp/batched-verdict
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402

ARMS = {"flower": ["engine=flower"], "batched": ["engine=inprocess", "batch-clients=true"]}


def run(config: Path, seeds: str, sets: list[str], out: Path) -> None:
    """One ``fedsys run`` of ``config`` over ``seeds`` into ``out``."""
    cmd = [sys.executable, "-m", "fedsys_launch", "run", str(config), f"--seeds={seeds}",
           *(f"--set={s}" for s in sets), f"--set=output-dir={out}", "--set=name=v"]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "w") as log:
        code = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"fedsys run failed (exit {code}): see {out / 'log.txt'}")


def accuracies(tree: Path, seed: int, strategy: str) -> tuple[float, float]:
    """Final accuracy and the mean of the last 5 rounds' of one seed's strategy."""
    recs = [r for r in metrics.read_jsonl(tree / "v" / f"seed-{seed}" / strategy / "metrics.jsonl")
            if "accuracy" in r]
    return float(recs[-1]["accuracy"]), statistics.fmean(float(r["accuracy"]) for r in recs[-5:])


def main() -> None:
    """Run both arms, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("config", type=Path)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=Path("/tmp/fedsys-batched-verdict"))
    ap.add_argument("--reuse", action="store_true", help="read runs already in --out")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    for arm, extra in ARMS.items():
        if not args.reuse:
            run(args.config.resolve(), args.seeds, [*args.set, *extra], args.out.resolve() / arm)
    first = args.out.resolve() / "flower" / "v" / f"seed-{seeds[0]}"
    strategies = sorted(p.name for p in first.iterdir() if (p / "metrics.jsonl").is_file())
    print("| strategy | seed | flower final | batched final | flower last-5 | batched last-5 |")
    print("|---|---:|---:|---:|---:|---:|")
    verdicts = []
    for s in strategies:
        finals, lasts = [], []
        for k in seeds:
            (fa, fl), (ba, bl) = (accuracies(args.out.resolve() / arm, k, s) for arm in ARMS)
            print(f"| {s} | {k} | {fa:.4f} | {ba:.4f} | {fl:.4f} | {bl:.4f} |")
            finals.append(ba - fa)
            lasts.append(bl - fl)
        verdicts.append((s, finals, lasts))
    print("\n| strategy | final: batched − flower per seed | verdict | last-5 mean: per seed | verdict |")
    print("|---|---|---|---|---|")
    for s, finals, lasts in verdicts:
        print(f"| {s} | {', '.join(f'{d:+.4f}' for d in finals)} | {metrics.verdict(finals)} "
              f"| {', '.join(f'{d:+.4f}' for d in lasts)} | {metrics.verdict(lasts)} |")


if __name__ == "__main__":
    main()
