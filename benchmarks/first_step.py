"""A training process's first optimiser step: ``torch.optim`` against ``clients.optim``.

Every process that trains pays its first step once: each deployed ClientApp message (a
process of its own), each simulation actor, each ``fedsys run``.  ``torch.optim.Optimizer``
imports ``torch._dynamo`` then; ``clients.optim.Optimiser`` (the trainers' optimiser) calls
the same functional updates without it.  Per arm, a fresh Python process imports torch,
builds the CNN of the FedCDA paper and takes one SGD step with momentum and one Adam step;
it reports its own CPU seconds (user + system) for the whole process and for the steps
alone, and the parameters' checksum, which must be the same in both arms.  Arms alternate.

Usage::

    python benchmarks/first_step.py [--pairs 5] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from fedsys_launch import recording  # noqa: E402

CHILD = r"""
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import torch
from fedsys.models import build_model
net = build_model("fmnist-cnn", (1, 28, 28), 10, 0)
torch.manual_seed(0)
x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
c0 = cpu()
for kind in ("sgd", "adam"):
    if sys.argv[1] == "torch.optim":
        opt = (torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9) if kind == "sgd"
               else torch.optim.Adam(net.parameters(), lr=0.001))
    else:
        from clients.optim import Optimiser
        opt = Optimiser(net.parameters(), kind, 0.01 if kind == "sgd" else 0.001, momentum=0.9)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
steps = cpu() - c0
check = float(sum(p.double().sum() for p in net.parameters()))
print(json.dumps({"process": cpu(), "steps": steps, "check": check,
                  "dynamo": "torch._dynamo" in sys.modules}))
"""
ARMS = ("torch.optim", "clients.optim")


def one(arm: str) -> dict[str, float]:
    """CPU seconds of one fresh process (whole, and its two first steps) and its checksum."""
    out = subprocess.run([sys.executable, "-c", CHILD, arm], cwd=ROOT, capture_output=True,
                         text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        sys.exit(f"first_step: the {arm} process failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="processes per arm (default 5)")
    ap.add_argument("--record", action="store_true", help="write the table to docs/performance.md")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    for i in range(args.pairs):
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
            r = one(arm)
            runs[arm].append(r)
            print(f"{arm:13s} {i}: process {r['process']:.2f} s CPU, first steps "
                  f"{r['steps']:.2f} s, torch._dynamo imported: {r['dynamo']}", flush=True)
    checks = {r["check"] for v in runs.values() for r in v}
    med = {a: {k: statistics.median(r[k] for r in v) for k in ("process", "steps")}
           for a, v in runs.items()}
    t, c = med["torch.optim"], med["clients.optim"]
    table = "\n".join([
        f"| CPU s (median of {args.pairs}) | torch.optim | clients.optim | ratio |",
        "|---|---:|---:|---:|",
        f"| first SGD + Adam step | {t['steps']:.2f} | {c['steps']:.2f} | "
        f"{c['steps'] / t['steps']:.2f} |",
        f"| whole process (import torch, model, steps) | {t['process']:.2f} | "
        f"{c['process']:.2f} | {c['process'] / t['process']:.2f} |"])
    note = (f"Parameters after the steps, summed: {', '.join(repr(x) for x in sorted(checks))} "
            "(one value: the same updates).")
    print(table + "\n\n" + note)
    if len(checks) != 1:
        sys.exit("first_step: the arms' parameters differ")
    if args.record:
        cmd = "python benchmarks/first_step.py " + " ".join(sys.argv[1:])
        body = ("A fresh process imports torch, builds the FedCDA paper's CNN and takes one "
                "SGD step (momentum 0.9) and one Adam step, with `torch.optim` or with the "
                "trainers' `clients.optim.Optimiser` (torch's functional `sgd` / `adam`, the "
                "functions `torch.optim.SGD.step` and `Adam.step` call), alternating. "
                "`torch.optim.Optimizer` imports `torch._dynamo` at its first use; every "
                "process that trains pays it once: each deployed ClientApp message, each "
                "simulation actor.\n\n" + table + "\n\n" + note + "\n")
        doc = ROOT / "docs" / "performance.md"
        recording.record_section(doc, "## First optimiser step", cmd, body)
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
