"""Tables and curves for docs/results/fedcross.md from the runs of scripts/reproduce_fedcross.sh.

Prints, as Markdown:

- per partition (Dir(0.1), Dir(0.5), IID): FedAvg, FedProx and FedCross, final / last-10 /
  best accuracy and the round each first reaches 60 % and 70 % (FedCross is expected to lag
  early, spec fedcross.md §5.4);
- the collaborator-selection rules (in order, highest, lowest) and alpha (0.5, 0.9, 0.99)
  at Dir(0.1);
- the accelerations (warm-up, propeller models, dynamic alpha, PM-DA) against vanilla
  FedCross and FedAvg: accuracy at rounds 10, 20, 30 and at the end.

Curves go to docs/results/fedcross-*.png and the per-round metrics to docs/results/data/.

Usage::

    python scripts/fedcross_report.py [--runs runs] [--out docs/results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402

Records = list[dict[str, Any]]

PARTITIONS = {"fedcross-dir0.1": "Dirichlet 0.1", "fedcross-dir0.5": "Dirichlet 0.5",
              "fedcross-iid": "IID"}
MAIN = {"FedAvg": "fedavg", "FedProx": "fedprox", "FedCross": "fedcross"}
#: label -> (run, strategy label); lowest similarity with alpha 0.99 is the main Dir(0.1) run
ABLATION = {
    "in order (alpha 0.99)": ("fedcross-ablation", "fedcross-selection-in-order"),
    "highest similarity (alpha 0.99)": ("fedcross-ablation", "fedcross-selection-highest"),
    "lowest similarity (alpha 0.99)": ("fedcross-dir0.1", "fedcross"),
    "lowest, alpha 0.9": ("fedcross-ablation", "fedcross-alpha-0.9"),
    "lowest, alpha 0.5": ("fedcross-ablation", "fedcross-alpha-0.5"),
}
ACCEL = {
    "FedAvg": ("fedcross-dir0.1", "fedavg"),
    "FedCross (vanilla)": ("fedcross-dir0.1", "fedcross"),
    "warm-up 15 rounds": ("fedcross-accel", "fedcross-warmup-15"),
    "propeller models, 30 rounds": ("fedcross-accel", "fedcross-propeller-rounds-30"),
    "dynamic alpha, 30 rounds": ("fedcross-accel", "fedcross-dynamic-alpha-rounds-30"),
    "PM-DA, 15 + 15 rounds": ("fedcross-accel",
                              "fedcross-propeller-rounds-15-dynamic-alpha-rounds-15"),
}


def first_reach(recs: Records, target: float) -> str:
    for r in recs:
        if r["round"] > 0 and r["accuracy"] >= target:
            return str(r["round"])
    return "-"


def at(recs: Records, rnd: int) -> str:
    hit = [r for r in recs if r["round"] == rnd]
    return f"{100 * hit[0]['accuracy']:.2f}" if hit else "-"


def summary_row(label: str, recs: Records) -> str:
    s = metrics.summarise(recs, 10)
    return (f"| {label} | {int(s['rounds'])} | {100 * s['final']:.2f} | "
            f"{100 * s['last_mean']:.2f} ± {100 * s['last_std']:.2f} | {100 * s['best']:.2f} | "
            f"{first_reach(recs, 0.6)} | {first_reach(recs, 0.7)} |")


HEAD = ["| method | rounds | final % | last-10 mean ± std % | best % | round >= 60 % | "
        "round >= 70 % |", "|---|---:|---:|---:|---:|---:|---:|"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    data = out / "data"
    for run, title in PARTITIONS.items():
        curves = {k: metrics.kept_records(runs, data, run, s) for k, s in MAIN.items()}
        curves = {k: v for k, v in curves.items() if v}
        print(f"\n### {title}\n")
        if not curves:
            print("(not run)")
            continue
        print("\n".join(HEAD + [summary_row(k, v) for k, v in curves.items()]))
        metrics.plot_curves(curves, out / f"{run}-accuracy.png", f"FedCross, Fashion-MNIST, {title}")
    for title, table, name in (("Selection rule and alpha, Dirichlet 0.1", ABLATION, "ablation"),
                               ("Accelerations, Dirichlet 0.1", ACCEL, "accel")):
        curves = {k: metrics.kept_records(runs, data, r, s) for k, (r, s) in table.items()}
        curves = {k: v for k, v in curves.items() if v}
        print(f"\n### {title}\n")
        if not curves:
            print("(not run)")
            continue
        if name == "accel":
            print("| method | round 10 % | round 20 % | round 30 % | mean of rounds 1-30 % | "
                  "round >= 60 % | final % | last-10 mean ± std % |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for k, v in curves.items():
                s = metrics.summarise(v, 10)
                early = [r["accuracy"] for r in v if 1 <= r["round"] <= 30]
                print(f"| {k} | {at(v, 10)} | {at(v, 20)} | {at(v, 30)} | "
                      f"{100 * sum(early) / max(1, len(early)):.2f} | {first_reach(v, 0.6)} | "
                      f"{100 * s['final']:.2f} | {100 * s['last_mean']:.2f} ± {100 * s['last_std']:.2f} |")
        else:  # the ablation: also how far apart the K slots end (mean L2 distance to their mean)
            print(HEAD[0] + " slot spread, last round |")
            print(HEAD[1] + "---:|")
            for k, v in curves.items():
                spread = v[-1].get("fedcross-slot-spread")
                print(summary_row(k, v) + (f" {spread:.3f} |" if spread is not None else " - |"))
        metrics.plot_curves(curves, out / f"fedcross-{name}-accuracy.png",
                            f"FedCross on Fashion-MNIST: {title}")


if __name__ == "__main__":
    main()
