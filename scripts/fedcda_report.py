"""Tables and curves for docs/results/fedcda.md from the runs of scripts/reproduce_fedcda.sh.

Each run's per-round metrics are copied to docs/results/data/<run>.jsonl; a run whose
directory is gone (runs/ is not kept between machines) is read back from there.

Usage::

    python scripts/fedcda_report.py [--runs runs] [--out docs/results]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402

# Paper, Table 1 (FMNIST, simple CNN): mean ± std of the last 10 rounds, 2 runs.
PAPER = {
    "fedcda-dir0.1": ("Dirichlet 0.1", "71.81±5.61", "78.63±0.14"),
    "fedcda-dir0.3": ("Dirichlet 0.3", "75.97±3.21", "84.67±0.12"),
    "fedcda-dir0.5": ("Dirichlet 0.5", "79.73±1.94", "87.01±0.08"),
    "fedcda-shards2": ("Shards 2", "64.69±5.62", "66.30±0.07"),
}


def fmt(recs: list[dict[str, Any]], last: int = 10) -> tuple[str, float, float]:
    s = metrics.summarise(recs, last)
    if not s:
        return "(not run)", float("nan"), float("nan")
    return f"{100 * s['last_mean']:.2f}±{100 * s['last_std']:.2f}", s["last_mean"], s["last_std"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    rows = ["| partition | FedAvg (ours) | FedCDA (ours) | gain | std ratio FedAvg/FedCDA "
            "| FedAvg (paper) | FedCDA (paper) | rounds done |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    curves: dict[str, list[dict[str, Any]]] = {}
    for name, (label, p_avg, p_cda) in PAPER.items():
        avg = metrics.kept_records(runs, data, name, "fedavg")
        cda = metrics.kept_records(runs, data, name, "fedcda")
        a, am, asd = fmt(avg)
        c, cm, csd = fmt(cda)
        gain = f"{100 * (cm - am):+.2f}" if avg and cda else "-"
        ratio = f"{asd / csd:.1f}" if avg and cda and csd > 0 else "-"
        done = f"{len([r for r in avg if r['round'] > 0])}/{len([r for r in cda if r['round'] > 0])}"
        rows.append(f"| {label} | {a} | {c} | {gain} | {ratio} | {p_avg} | {p_cda} | {done} |")
        if avg:
            curves[f"{label}: FedAvg"] = avg
        if cda:
            curves[f"{label}: FedCDA"] = cda
        if (runs / name / "accuracy.png").exists():
            shutil.copy(runs / name / "accuracy.png", out / f"{name}-accuracy.png")
    abl_rows = ["| aggregation (Dirichlet 0.3) | last-10 mean ± std % | final % | "
                "mean models from earlier rounds per round |", "|---|---:|---:|---:|"]
    abl = {"FedAvg": "fedavg", "newest": "fedcda-selection-newest",
           "random": "fedcda-selection-random", "approximate (FedCDA)": "fedcda"}
    for label, d in abl.items():
        recs = metrics.kept_records(runs, data, "fedcda-dir0.3", d)
        s, _, _ = fmt(recs)
        fin = f"{100 * recs[-1]['accuracy']:.2f}" if recs else "-"
        old = [r["fedcda-earlier-models"] for r in recs if r.get("fedcda-warmup") == 0.0]
        olds = f"{sum(old) / len(old):.2f}" if old else "-"
        abl_rows.append(f"| {label} | {s} | {fin} | {olds} |")
    if curves:
        metrics.plot_curves(curves, out / "fedcda-accuracy.png", "FedCDA vs FedAvg, Fashion-MNIST")
    (out / "fedcda-table.md").write_text("\n".join(rows) + "\n\n" + "\n".join(abl_rows) + "\n")
    print("\n".join(rows))
    print()
    print("\n".join(abl_rows))


if __name__ == "__main__":
    main()
