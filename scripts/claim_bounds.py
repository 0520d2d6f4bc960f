"""Where a bound on claimed ``num-examples`` binds on honest clients (issue 77): for every
reproduction behind docs/results (``configs/experiments/matrix.yaml``, each seed) and every
preset of ``configs/``, the rounds in which a share cap (``max-weight-share``) and a ratio to
the median of the round's other claims (``max-weight-ratio``) would cut a claim.

A client claims its partition's size (what fedsys's ClientApp reports); a round's clients
are the seeded draw of :meth:`strategies.nodes.NodeDirectory.sample` (``clients-per-round``
of ``num-clients``, by the run's seed and the round).  Attackers are left out: the counts are
of honest rounds.  Only a weighted mean reads the claims (a chain's hop has one reply), so a
count is an upper bound for the methods that weight by examples in some rounds only
(FedCDA's warm-up); every method's round train loss is weighted by them.

Usage::

    python scripts/claim_bounds.py [--share 0.5] [--ratio 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fedsys.seeding import derive_seed  # noqa: E402
from fedsys.task import partitions  # noqa: E402
from fedsys_launch import config_schema  # noqa: E402
from strategies.nodes import SAMPLE_TAG  # noqa: E402


def binds(claims: list[int], share: float, ratio: float) -> tuple[bool, bool]:
    """Whether the share cap, and the ratio bound, cut a claim of one round."""
    if len(claims) < 2:
        return False, False
    by_share = 0 < share < 1 and max(claims) > share * sum(claims)
    by_ratio = ratio > 0 and any(
        c > ratio * statistics.median(claims[:i] + claims[i + 1:]) for i, c in enumerate(claims))
    return by_share, by_ratio


def count(preset: str, sets: list[str], share: float, ratio: float) -> tuple[int, int, int]:
    """(rounds, rounds the share cap binds, rounds the ratio binds) of one run."""
    cfg = config_schema.load(ROOT / preset, [s for s in sets if not s.startswith("strategy=")])
    sizes = [len(p) for p in partitions(cfg)]
    n = len(sizes)
    k = min(cfg.clients_per_round or n, n)
    a = b = 0
    for rnd in range(1, cfg.num_server_rounds + 1):
        rng = np.random.default_rng(derive_seed(cfg.seed, rnd, SAMPLE_TAG))
        by_share, by_ratio = binds([sizes[int(i)] for i in rng.choice(n, size=k, replace=False)],
                                   share, ratio)
        a += by_share
        b += by_ratio
    return cfg.num_server_rounds, a, b


def main(argv: list[str] | None = None) -> int:
    """Print a Markdown table of the runs a bound binds on, and the totals."""
    import reproduce

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--share", type=float, default=0.5, help="max-weight-share (0: none)")
    p.add_argument("--ratio", type=float, default=15.0, help="max-weight-ratio (0: none)")
    args = p.parse_args(argv)
    runs: dict[tuple[str, tuple[str, ...]], str] = {}
    for exp in reproduce.experiments():
        for run in exp.runs:
            for seed in exp.seeds or (None,):
                sets = (*run.sets, *((f"seed={seed}",) if seed is not None else ()))
                sets = tuple(s for s in sets if not s.startswith(("attack.", "max-weight-")))
                runs.setdefault((run.preset, sets), f"{exp.group}/{exp.setting} seed {seed}")
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        runs.setdefault((f"configs/{path.name}", ()), f"preset {path.stem}")
    print(f"| run | rounds | share {args.share:g} binds | ratio {args.ratio:g} binds |")
    print("|---|---:|---:|---:|")
    total = [0, 0, 0]
    for (preset, sets), name in runs.items():
        rounds, a, b = count(preset, list(sets), args.share, args.ratio)
        total = [total[0] + rounds, total[1] + a, total[2] + b]
        if a or b:
            print(f"| {name} | {rounds} | {a} | {b} |")
    print(f"| all {len(runs)} runs | {total[0]} | {total[1]} | {total[2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
