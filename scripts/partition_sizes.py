"""Client-size spread of each method's Dirichlet presets under every Dirichlet partitioner
(issue 45): the table of "Partitions" on docs/results/{fedcda,fedcross,ima}.md.

For each preset and alpha, seeds 0-2, the partition of ``fedsys partition`` (the same
:func:`fedsys.task.partitions`, so the same clients a run trains), summarised by
:func:`fedsys.partition.size_spread`: smallest and largest client, and the coefficient of
variation of the sizes (std / mean), mean over the seeds.

Usage::

    python scripts/partition_sizes.py            # prints a Markdown table
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys.partition import size_spread  # noqa: E402
from fedsys.task import partitions  # noqa: E402
from fedsys_launch import config_schema  # noqa: E402

#: (preset, the Dirichlet alphas of its rows)
PRESETS = [("configs/fedcda-fmnist.yaml", (0.1, 0.3, 0.5)),
           ("configs/fedcross-fmnist.yaml", (0.1, 0.5)),
           ("configs/ima-fmnist.yaml", (0.3,))]
KINDS = ("dirichlet", "dirichlet-balanced", "dirichlet-capped")


def main() -> None:
    """Print one row per preset, alpha and partitioner."""
    print("| preset | clients | alpha | partition | smallest client | largest client | "
          "coefficient of variation (seeds 0, 1, 2) |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for preset, alphas in PRESETS:
        for alpha in alphas:
            for kind in KINDS:
                spreads = []
                for seed in (0, 1, 2):
                    cfg = config_schema.load(ROOT / preset, [f"partition={kind}",
                                                        f"dirichlet-alpha={alpha}",
                                                        f"seed={seed}"])
                    spreads.append(size_spread(partitions(cfg)))
                cv = ", ".join(f"{s['cv']:.2f}" for s in spreads)
                print(f"| `{Path(preset).name}` | {cfg.num_clients} | {alpha} | `{kind}` | "
                      f"{min(s['min'] for s in spreads):.0f} | "
                      f"{max(s['max'] for s in spreads):.0f} | "
                      f"{statistics.mean(s['cv'] for s in spreads):.2f} ({cv}) |")


if __name__ == "__main__":
    main()
