"""Per-client costs of a round's messages and checks, old way and new way side by side.

Each pair times, in this process and one thread, what fedsys did before 2026-12-06 and what
it does now, on the same inputs (medians of ``--repeats`` timings of ``--number`` calls):

- writing the MLP's model record: Flower's ``ArrayRecord({k: Array(v)})`` against
  :func:`fedsys.protocol.to_record`; reading it: ``Array.numpy()`` per array against
  :func:`fedsys.protocol.from_record`;
- the partition-claim check at ``--nodes`` reported nodes: a pass over every report against
  :class:`strategies.nodes.Reports`;
- normalising a step's 3,200 Fashion-MNIST-sized images: the expression used before against
  :class:`fedsys.data.Normaliser` (in place on one copy);
- an instruction's config (12 keys): a ``ConfigRecord`` built for each against a copy of the
  round's one (:func:`fedsys.protocol.config_record`);
- the leave-one-out medians of a round's 100 update norms: a sorted list of the others per
  node against :func:`fedsys.validation.others_medians`;
- seeding torch at a client's training, from 40 frames deep (a ClientApp's stack in a run):
  ``torch.manual_seed`` against :func:`fedsys.seeding.seed_torch` (on a machine without an
  accelerator; with one both are ``torch.manual_seed``).

Every pair is also checked equal (bytes, arrays, the holder found, the tensor), so a ratio is
never bought with a different result.

Usage::

    python benchmarks/message_costs.py
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedsys import protocol
from fedsys.data import Normaliser
from fedsys.models import build_model
from fedsys.seeding import seed_torch
from fedsys.validation import others_medians
from strategies.nodes import Reports


def _time(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Median seconds of one call."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeats)) / number


def main() -> None:
    """Time each pair, check it equal, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--nodes", type=int, default=100_000)
    args = ap.parse_args()
    if min(args.number, args.repeats, args.nodes) < 1:
        ap.error("--number, --repeats and --nodes must be at least 1")
    torch.set_num_threads(1)
    n, r = args.number, args.repeats
    params = {k: v.detach().numpy().copy()
              for k, v in build_model("mlp", (1, 28, 28), 10, 0).state_dict().items()}
    flower = ArrayRecord({k: Array(v) for k, v in params.items()})
    ours = protocol.to_record(params)
    assert all(flower[k].data == ours[k].data for k in params)
    back = protocol.from_record(flower)
    assert all(np.array_equal(back[k], flower[k].numpy()) for k in params)

    reported = {node: node for node in range(args.nodes)}
    reports = Reports(reported)
    claim, asker = args.nodes - 1, 5

    def scan() -> int | None:
        return next((m for m, p in reported.items() if p == claim and m != asker), None)

    assert scan() == reports.holder(claim, asker)

    x = torch.randint(0, 256, (3200, 1, 28, 28), dtype=torch.uint8)
    norm = Normaliser((0.2860,), (0.3530,))
    m, s = torch.tensor(norm.mean).view(1, -1, 1, 1), torch.tensor(norm.std).view(1, -1, 1, 1)

    def old_norm() -> torch.Tensor:
        return (x.to(torch.float32) / 255.0 - m) / s

    assert torch.equal(old_norm(), norm(x))

    cfg = {f"key-{i}": (i if i % 3 else float(i) if i % 2 else f"v{i}") for i in range(12)}
    one = protocol.config_record(cfg)
    assert ConfigRecord(dict(cfg)) == protocol.config_record(one)

    rng = np.random.default_rng(0)
    norms = {int(k): float(v) for k, v in enumerate(rng.gamma(2.0, 1.0, 100))}

    def direct_medians() -> dict[int, float]:
        return {k: statistics.median([v for j, v in norms.items() if j != k]) for k in norms}

    assert direct_medians() == others_medians(norms)

    def deep(fn: Callable[[], object], depth: int = 40) -> object:
        return fn() if depth == 0 else deep(fn, depth - 1)

    deep(lambda: torch.manual_seed(7))
    want = torch.get_rng_state()
    deep(lambda: seed_torch(7))
    assert torch.equal(torch.get_rng_state(), want)

    pairs = [
        ("write the MLP's record", lambda: ArrayRecord({k: Array(v) for k, v in params.items()}),
         lambda: protocol.to_record(params), n),
        ("read the MLP's record", lambda: {k: flower[k].numpy() for k in flower.keys()},
         lambda: protocol.from_record(flower), n),
        (f"partition claim, {args.nodes:,} nodes", scan,
         lambda: reports.holder(claim, asker), max(n // 20, 1)),
        ("normalise 3,200 images", old_norm, lambda: norm(x), max(n // 10, 1)),
        ("an instruction's config record", lambda: ConfigRecord(dict(cfg)),
         lambda: protocol.config_record(one), n),
        ("leave-one-out medians, 100 norms", direct_medians, lambda: others_medians(norms),
         max(n // 20, 1)),
        ("seed torch, 40 frames deep", lambda: deep(lambda: torch.manual_seed(7)),
         lambda: deep(lambda: seed_torch(7)), max(n // 4, 1)),
    ]
    print("| what | before ms | now ms | before / now |")
    print("|---|---:|---:|---:|")
    for label, before, now, calls in pairs:
        tb, tn = _time(before, calls, r), _time(now, calls, r)
        print(f"| {label} | {tb * 1e3:.4f} | {tn * 1e3:.4f} | {tb / tn:.1f} |", flush=True)


if __name__ == "__main__":
    main()
