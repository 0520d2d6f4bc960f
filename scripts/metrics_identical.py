"""Compare the per-round metrics and final models of two run trees, bit for bit: the proof a
refactor gives.

Every number of every ``<run>/<strategy>/metrics.jsonl`` under the first tree must be equal in
the second (wall-clock keys aside: ``round-time``, ``fedcda-aggregation-s``,
``fedcross-seconds``); keys only the second has are listed, not failed.  Where the first tree
holds a strategy's final ``model.pt``, the second's must hold the same tensors, bit for bit.
Exit 0 when all are identical.

Usage, the before/after check of a change (``git worktree`` for the old code): every preset
with each checkout by ``scripts/presets_identical.sh CHECKOUT OUT`` (its header says how),
then::

    python scripts/metrics_identical.py /tmp/cmp/before /tmp/cmp/after
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TIMING = frozenset({"round-time", "fedcda-aggregation-s", "fedcross-seconds"})


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(a: Path, b: Path) -> tuple[list[str], int, set[str]]:
    """Differences between two ``metrics.jsonl`` files, values compared, keys added in ``b``."""
    ra, rb = _records(a), _records(b)
    diffs = [f"{len(ra)} records vs {len(rb)}"] if len(ra) != len(rb) else []
    values, added = 0, set()
    for x, y in zip(ra, rb, strict=False):
        where = f"{x.get('strategy')} round {x.get('round')}"
        for k, v in x.items():
            if k in TIMING:
                continue
            values += 1
            if k not in y:
                diffs.append(f"{where}: '{k}' missing")
            elif v != y[k]:
                diffs.append(f"{where}: '{k}' {v!r} != {y[k]!r}")
        added |= set(y) - set(x)
    return diffs, values, added


def compare_models(a: Path, b: Path) -> list[str]:
    """Differences between two saved state dicts (``model.pt``): keys, shapes, values."""
    import torch

    ma = torch.load(a, map_location="cpu", weights_only=True)
    mb = torch.load(b, map_location="cpu", weights_only=True)
    if ma.keys() != mb.keys():
        return [f"keys differ: {sorted(set(ma) ^ set(mb))}"]
    return [f"'{k}' differs" for k in ma
            if ma[k].shape != mb[k].shape or ma[k].dtype != mb[k].dtype
            or not torch.equal(ma[k], mb[k])]


def main(argv: list[str] | None = None) -> int:
    """Compare every strategy directory of every run under two trees."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args(argv)
    files = sorted(f.relative_to(args.before) for f in args.before.glob("**/metrics.jsonl")
                   if f.parent.parent != args.before.parent and f.parent != args.before)
    bad = 0
    for rel in files:
        other = args.after / rel
        if not other.exists():
            print(f"{rel.parent}: missing in {args.after}")
            bad += 1
            continue
        diffs, values, added = compare(args.before / rel, other)
        model = args.before / rel.parent / "model.pt"
        tensors = ""
        if model.exists() and rel.parent.parent != Path("."):
            theirs = args.after / rel.parent / "model.pt"
            diffs += compare_models(model, theirs) if theirs.exists() else [
                f"no model.pt in {theirs.parent}"]
            tensors = " and the model"
        bad += bool(diffs)
        extra = f"; new keys {sorted(added)}" if added else ""
        print(f"{rel.parent}: {'DIFFERENT' if diffs else 'IDENTICAL'} ({values} values"
              f"{tensors}){extra}")
        for d in diffs[:5]:
            print("   ", d)
    if not files:
        print(f"no <run>/<strategy>/metrics.jsonl under {args.before}: nothing compared")
        return 1
    print("ALL IDENTICAL" if not bad else f"{bad} of {len(files)} differ")
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
