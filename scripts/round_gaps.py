"""Per-round paired gaps across seeds: for each round, the mean +- std over seeds of
``variant - baseline`` accuracy (percentage points), and the worst single seed.

    python scripts/round_gaps.py runs/lss/lss-defaults fedavg lss-default [--from 3]

``RUN`` holds ``seed-<k>/<label>/metrics.jsonl`` (``fedsys run --seeds``).  Prints a
markdown table and, on its last line, the smallest per-round mean gap from round ``--from``
on and the smallest single-seed gap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedsys.metrics import read_jsonl


def accuracy(path: Path) -> dict[int, float]:
    """Round -> accuracy (in %) of one metrics file."""
    return {int(r["round"]): 100 * float(r["accuracy"]) for r in read_jsonl(path)
            if r.get("accuracy") is not None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("baseline")
    ap.add_argument("variant")
    ap.add_argument("--from", dest="start", type=int, default=3)
    a = ap.parse_args()
    seeds = sorted(a.run.glob("seed-*"), key=lambda p: int(p.name.split("-")[1]))
    if not seeds:
        print(f"error: no seed-<k>/ directories in {a.run}", file=sys.stderr)
        return 2
    seeds = [s for s in seeds if all((s / lab / "model.pt").exists()
                                     for lab in (a.baseline, a.variant))]  # finished runs
    if not seeds:
        print(f"error: no finished seed in {a.run} has both {a.baseline} and {a.variant}",
              file=sys.stderr)
        return 2
    base = [accuracy(s / a.baseline / "metrics.jsonl") for s in seeds]
    var = [accuracy(s / a.variant / "metrics.jsonl") for s in seeds]
    rounds = sorted(set.intersection(*(set(b) & set(v) for b, v in zip(base, var, strict=True))))
    names = ", ".join(s.name for s in seeds)
    print(f"| round | {a.baseline} | {a.variant} | gap, mean ± std ({names}) | worst seed |")
    print("|---:|---:|---:|---:|---:|")
    worst_mean, worst_seed = float("inf"), float("inf")
    for r in rounds:
        gaps = [v[r] - b[r] for b, v in zip(base, var, strict=True)]
        m = statistics.mean(gaps)
        sd = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
        print(f"| {r} | {statistics.mean(b[r] for b in base):.2f} | "
              f"{statistics.mean(v[r] for v in var):.2f} | {m:+.2f} ± {sd:.2f} | {min(gaps):+.2f} |")
        if r >= a.start:
            worst_mean, worst_seed = min(worst_mean, m), min(worst_seed, min(gaps))
    print(f"\nfrom round {a.start} on: smallest mean gap {worst_mean:+.2f}, "
          f"smallest single-seed gap {worst_seed:+.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
