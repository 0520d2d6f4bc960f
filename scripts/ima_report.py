"""Tables and curves for docs/results/ima.md from the runs of scripts/reproduce_ima.sh.

For each partition it gathers five curves (FedAvg, FedAvg+IMA, the "same decay, no
averaging" control, FedProx, FedProx+IMA), prints the final / last-10 / best accuracy
table with the paper's Table I FMNIST rows beside it, the round at which each method first
reaches a few target accuracies (Table II style), writes the curves
(docs/results/ima-<partition>-accuracy.png) and keeps the per-round metrics in
docs/results/data/ so the tables can be rebuilt without the runs.

Usage::

    python scripts/ima_report.py [--runs runs] [--out docs/results] [--partitions shards2 dir0.3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402

#: label -> (run directory suffix, strategy label inside it); see scripts/reproduce_ima.sh
METHODS = {
    "FedAvg": ("-fedavg", "ima-base-fedavg-average-false-lr-decay-0.99"),
    "FedAvg+IMA": ("", "ima-base-fedavg"),
    "FedAvg, IMA decay, no averaging": ("-fedavg", "ima-base-fedavg-average-false"),
    "FedProx": ("-fedprox", "ima-base-fedprox-average-false-lr-decay-0.99"),
    "FedProx+IMA": ("", "ima-base-fedprox"),
}

#: Table II-style targets per partition: around and above FedAvg's last-10 mean there.
TARGETS = {"shards2": (0.74, 0.76, 0.77, 0.78), "dir0.3": (0.80, 0.81, 0.82, 0.83)}

#: Paper Table I, FMNIST (CNN), FMA and (with IMA), rows "a" and "b" (skew label stripped).
PAPER = {"FedAvg": ("81.17", "84.68", "80.13", "83.06"),
         "FedProx": ("79.78", "83.77", "78.76", "81.64")}


def load(runs: Path, data: Path, part: str) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for label, (suffix, strat) in METHODS.items():
        recs = metrics.kept_records(runs, data, f"ima-{part}{suffix}", strat)
        if recs:
            out[label] = recs
    return out


def first_reach(recs: list[dict[str, Any]], target: float) -> int | None:
    for r in recs:
        if r["round"] > 0 and r["accuracy"] >= target:
            return int(r["round"])
    return None


def report(part: str, curves: dict[str, list[dict[str, Any]]], out: Path) -> str:
    lines = [f"### {part}", "",
             "| method | rounds | final % | last-10 mean ± std % | best % | final gain from IMA |",
             "|---|---:|---:|---:|---:|---:|"]
    final = {k: 100 * float(v[-1]["accuracy"]) for k, v in curves.items()}
    for label, recs in curves.items():
        s = metrics.summarise(recs, 10)
        base = label.split("+")[0] if "+IMA" in label else None
        gain = f"{final[label] - final[base]:+.2f}" if base in final else ""
        lines.append(f"| {label} | {recs[-1]['round']} | {final[label]:.2f} | "
                     f"{100 * s['last_mean']:.2f} ± {100 * s['last_std']:.2f} | "
                     f"{100 * s['best']:.2f} | {gain} |")
    targets = TARGETS.get(part, (0.74, 0.76, 0.77, 0.78))
    lines += ["", "Round at which each method first reaches a target test accuracy, Table II style "
              "(IMA starts in round 76; '-' = never in 100 rounds):", "",
              "| method | " + " | ".join(f"{100 * t:.0f} %" for t in targets) + " |",
              "|---|" + "---:|" * len(targets)]
    for label, recs in curves.items():
        cells = [first_reach(recs, t) for t in targets]
        lines.append(f"| {label} | " + " | ".join(str(c) if c else "-" for c in cells) + " |")
    metrics.plot_curves(curves, out / f"ima-{part}-accuracy.png",
                        f"IMA on Fashion-MNIST, {part} (IMA from round 76)")
    late = {k: [r for r in v if r["round"] >= 60] for k, v in curves.items()}
    metrics.plot_curves(late, out / f"ima-{part}-accuracy-late.png",
                        f"IMA on Fashion-MNIST, {part}, rounds 60-100")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--partitions", nargs="+", default=["shards2", "dir0.3"])
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("Paper, Table I, FMNIST (CNN): FMA (with IMA), rows a / b")
    for k, (a, ai, b, bi) in PAPER.items():
        print(f"  {k}: {a} ({ai}) / {b} ({bi})")
    for part in args.partitions:
        curves = load(runs, out / "data", part)
        if not curves:
            print(f"\n### {part}: no runs under {runs}")
            continue
        print()
        print(report(part, curves, out))


if __name__ == "__main__":
    main()
