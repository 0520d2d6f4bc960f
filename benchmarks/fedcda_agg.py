"""FedCDA server cost: aggregation time and peak server memory per round, against FedAvg.

Part 1, time: for P sampled clients per round, K = 3 cached models per client and
B in {3, P} batches set (the count used rises with P to keep each batch's search within
``fedcda.search-budget``, 4096 combinations), one selection round of :class:`strategies.fedcda.FedCDAStrategy`
(cache update, Eq. 8 batch searches, new global model) is timed against
:class:`strategies.fedavg.FedAvgStrategy`'s aggregation of the same P updates, for
the FMNIST CNN (582,026 parameters) and ResNet-18 (11.2 M).  The N = 2P clients'
caches are filled by warmup rounds first; the models are random perturbations of
one initial model (no training: only the server's arithmetic is measured).

Part 2, memory: a fresh process fills FedCDA's cache for N clients (K = 3 each,
P = 20 per round) and runs selection rounds; its peak resident memory is read from
``ru_maxrss``, for the RAM and the disk cache, next to FedAvg's.

Usage::

    python benchmarks/fedcda_agg.py [--quick] [--record]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: Where --record writes: subsections of "## FedCDA server cost" in docs/performance.md.
DOC, SECTION = ROOT / "docs" / "performance.md", "## FedCDA server cost"
sys.path.insert(0, str(ROOT))

from fedsys.fedcda import batch_sizes  # noqa: E402
from fedsys.models import build_model  # noqa: E402
from fedsys.params import Params, from_torch  # noqa: E402
from fedsys.validation import ClientUpdate  # noqa: E402
from fedsys_launch import recording  # noqa: E402
from fedsys_launch.config_schema import build  # noqa: E402
from strategies.fedavg import FedAvgStrategy  # noqa: E402
from strategies.fedcda import FedCDAStrategy  # noqa: E402

MODELS = {"fmnist-cnn": ("fmnist-cnn", 1, 28), "resnet18": ("resnet18", 3, 32)}


def base_model(name: str) -> Params:
    arch, ch, size = MODELS[name]
    return from_torch(build_model(arch, (ch, size, size), 10, seed=0).state_dict())


class UpdateMaker:
    """Cheap distinct client models: base + a*noise1 + b*noise2 (no RNG per model)."""

    def __init__(self, base: Params, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.base = base
        self.noise = [
            {k: (rng.standard_normal(v.shape, dtype=np.float32) * 0.01 if v.dtype.kind == "f"
                 else np.zeros_like(v)) for k, v in base.items()} for _ in range(2)
        ]
        self.rng = np.random.default_rng(seed + 1)

    def __call__(self, pid: int) -> ClientUpdate:
        a, b = self.rng.normal(size=2).astype(np.float32)
        p = {k: (v + a * self.noise[0][k] + b * self.noise[1][k]).astype(v.dtype) if v.dtype.kind == "f"
             else v.copy() for k, v in self.base.items()}
        return ClientUpdate(pid, pid, p, 100, {"train-loss": float(abs(a))})


def fill(strategy: FedCDAStrategy, make: UpdateMaker, n: int, p: int, k: int) -> int:
    """Warmup rounds over clients 0..n-1 in turn until each holds k models."""
    rnd = 0
    for _ in range(k):
        for lo in range(0, n, p):
            rnd += 1
            strategy.aggregate(rnd, [make(c) for c in range(lo, min(n, lo + p))])
    return rnd


def time_case(model: str, p: int, b: int, repeats: int, tmp: Path) -> tuple[float, float, int, int]:
    base = base_model(model)
    make = UpdateMaker(base)
    n = 2 * p
    cfg = build({"strategy": "fedcda", "num-clients": n, "clients-per-round": p,
                 "fedcda.batches": b, "fedcda.memory": 3, "fedcda.warmup": 0,
                 "output-dir": str(tmp), "model": model})
    cda = FedCDAStrategy.from_config(
        cfg.replace(**{"fedcda.cache-dir": str(tmp / f"{model}-{p}-{b}" / "fedcda-cache")}))
    rnd = fill(cda, make, n, p, 3)
    avg = FedAvgStrategy.from_config(cfg)
    t_cda, t_avg, combos = [], [], 0
    rng = np.random.default_rng(7)
    for _ in range(repeats):
        rnd += 1
        ups = [make(int(c)) for c in sorted(rng.choice(n, size=p, replace=False))]
        t0 = time.perf_counter()
        avg.aggregate(rnd, ups)
        t_avg.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        metrics = cda.aggregate(rnd, ups).metrics
        t_cda.append(time.perf_counter() - t0)
        combos = int(metrics.get("fedcda-combinations", 0))
        used = int(metrics.get("fedcda-batches", b))
    return float(np.median(t_avg)), float(np.median(t_cda)), combos, used


def memory_child(args: argparse.Namespace) -> None:
    """Run in a fresh process: fill and run rounds, print peak RSS in MiB."""
    base = base_model(args.model)
    make = UpdateMaker(base)
    cfg = build({"strategy": "fedcda", "num-clients": args.n, "clients-per-round": 20,
                 "fedcda.cache": "ram" if args.cache == "none" else args.cache,
                 "fedcda.cache-dir": str(Path(args.tmp) / "cda" / "fedcda-cache"),
                 "fedcda.warmup": 0, "output-dir": args.tmp})
    if args.cache == "none":
        s: FedAvgStrategy | FedCDAStrategy = FedAvgStrategy.from_config(cfg)
        for r in range(1, 3 * args.n // 20 + 3):
            s.aggregate(r, [make(c % args.n) for c in range(20 * r, 20 * r + 20)])
        disk = 0
    else:
        s = FedCDAStrategy.from_config(cfg)
        rnd = fill(s, make, args.n, 20, 3)
        for r in range(rnd + 1, rnd + 3):
            s.aggregate(r, [make(c) for c in range(20)])
            s.checkpoint_written()
        assert s.cache is not None
        disk = s.cache.nbytes_on_disk()
    # VmHWM, not ru_maxrss: the latter survives fork+exec and would report the parent's peak
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    peak = int(hwm.split()[1]) / 1024
    print(f"{peak:.0f} {disk}")


def memory_case(model: str, n: int, cache: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(dir=ROOT / "runs" if (ROOT / "runs").exists() else None) as tmp:
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--model", model, "--n", str(n),
             "--cache", cache, "--tmp", tmp],
            check=True, capture_output=True, text=True,
        ).stdout.split()
    return float(out[-2]), float(out[-1]) / 2**20


def _gram_pass(vecs: list[np.ndarray], centre: np.ndarray, dtype: type, block: int) -> np.ndarray:
    """Gram matrix of ``vecs - centre`` block by block, products in ``dtype``, sum in float64."""
    k, dim = len(vecs), int(vecs[0].shape[0])
    g = np.zeros((k, k))
    buf: np.ndarray = np.empty((k, block), dtype)
    tmp = np.empty(block)
    for lo in range(0, dim, block):
        hi = min(dim, lo + block)
        xb, cb = buf[:, : hi - lo], centre[lo:hi]
        for i, v in enumerate(vecs):
            if dtype is np.float64:
                np.subtract(v[lo:hi], cb, out=xb[i])
            else:  # centre in float64, then round the difference
                np.subtract(v[lo:hi], cb, out=tmp[: hi - lo])
                xb[i] = tmp[: hi - lo]
        g += xb @ xb.T
    return g


def gram_variants(repeats: int) -> list[str]:
    """Time the Gram step of one P = 20, B = 3 round (ResNet-18 size) four ways.

    The shipped path (:func:`fedsys.fedcda.centred_gram`, three batches of 21
    candidates, float64) against float32 block products (centred in float64, summed
    in float64) and against one pass over all 63 candidates (one wider product
    instead of three thin ones).  Max relative error against the shipped Gram.
    """
    from fedsys.fedcda import centred_gram

    dim = sum(int(v.size) for v in base_model("resnet18").values() if v.dtype.kind == "f")
    rng = np.random.default_rng(0)
    base = rng.standard_normal(dim, dtype=np.float32)
    vecs = [base + np.float32(0.01) * rng.standard_normal(dim, dtype=np.float32) for _ in range(63)]
    fixed_sum = 5 * base.astype(np.float64)
    centre = fixed_sum / 5
    batches = [vecs[i : i + 21] for i in range(0, 63, 21)]

    def best(fn: Any) -> tuple[float, Any]:
        times, out = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    t_ref, ref = best(lambda: [centred_gram(b, fixed_sum, 5).g for b in batches])
    scale = max(float(np.abs(g).max()) for g in ref)
    rows = ["| Gram step of one round (P = 20, B = 3, ResNet-18) | s | vs shipped | max rel. error |",
            "|---|---:|---:|---:|",
            f"| shipped: 3 batches x 21 candidates, float64 | {t_ref:.3f} | 1.00 | 0 |"]
    for label, dt, one in (("3 batches x 21, float32 products", np.float32, False),
                           ("one pass, 63 candidates, float64", np.float64, True),
                           ("one pass, 63 candidates, float32 products", np.float32, True)):
        if one:
            t, g = best(lambda dt=dt: _gram_pass(vecs, centre, dt, 1 << 15))
            err = max(float(np.abs(g[i : i + 21, i : i + 21] - ref[i // 21]).max())
                      for i in range(0, 63, 21))
        else:
            t, gs = best(lambda dt=dt: [_gram_pass(b, centre, dt, 1 << 14) for b in batches])
            err = max(float(np.abs(a - r).max()) for a, r in zip(gs, ref, strict=True))
        line = f"| {label} | {t:.3f} | {t / t_ref:.2f} | {err / scale:.1e} |"
        print(line, flush=True)
        rows.append(line)
    # The floor: the products alone, on rows already in place (no centring, no
    # conversion; uncentred, so not usable as such: the spec's cancellation).
    for label, dt in (("floor: products alone, float32 rows in place, uncentred", np.float32),
                      ("floor: products alone, float64 rows in place, uncentred", np.float64)):
        mats = [np.stack(b).astype(dt, copy=False) for b in batches]

        def products(mats: list[np.ndarray] = mats) -> None:
            for m in mats:
                g = np.zeros((21, 21))
                for lo in range(0, dim, 1 << 16):
                    x = m[:, lo : lo + (1 << 16)]
                    g += x @ x.T

        t, _ = best(products)
        del mats
        line = f"| {label} | {t:.3f} | {t / t_ref:.2f} | - |"
        print(line, flush=True)
        rows.append(line)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small cases only (a check that it runs)")
    ap.add_argument("--record", action="store_true", help="write the tables to docs/performance.md")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also ResNet-18 at P = 100")
    ap.add_argument("--part", choices=("time", "memory", "gram", "all"), default="all")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="fmnist-cnn", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=100, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="ram", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        memory_child(args)
        return
    ps = [4, 20] if args.quick else [4, 20, 50, 100]
    models = ["fmnist-cnn"] if args.quick else ["fmnist-cnn", "resnet18"]
    rows = ["| model | P | B set | B used | batch sizes | combinations | FedAvg s | FedCDA s | "
            "ratio FedCDA/FedAvg |", "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    if args.part in ("time", "all"):
        with tempfile.TemporaryDirectory() as tmpd:
            for model in models:
                for p in ps:
                    for b in sorted({3, p}):
                        if model == "resnet18" and p == 100 and not args.full:
                            continue  # 300 ResNet-18 copies in RAM; see --full
                        ta, tc, combos, used = time_case(model, p, b, args.repeats, Path(tmpd))
                        sizes = batch_sizes(p, used)
                        line = (f"| {model} | {p} | {b} | {used} | {min(sizes)}..{max(sizes)} | "
                                f"{combos:,} | {ta:.3f} | {tc:.3f} | {tc / ta:.2f} |")
                        print(line, flush=True)
                        rows.append(line)
    mem = ["| model | N | cache | peak RSS MiB | cache on disk MiB |", "|---|---:|---|---:|---:|"]
    cases = ([("fmnist-cnn", 100, "none"), ("fmnist-cnn", 100, "ram"), ("fmnist-cnn", 100, "disk")]
             if args.quick else
             [("fmnist-cnn", n, c) for n in (100, 1000) for c in ("none", "ram", "disk")]
             + [("resnet18", 20, c) for c in ("none", "ram", "disk")] + [("resnet18", 60, "disk")])
    if args.part in ("memory", "all"):
        for model, n, cache in cases:
            rss, disk = memory_case(model, n, cache)
            label = "FedAvg (no cache)" if cache == "none" else cache
            line = f"| {model} | {n} | {label} | {rss:.0f} | {disk:.0f} |"
            print(line, flush=True)
            mem.append(line)
    gram_rows = gram_variants(args.repeats) if args.part in ("gram", "all") else []
    if args.record:
        cmd = "python benchmarks/fedcda_agg.py " + " ".join(sys.argv[1:])
        stamp = recording.stamp(cmd)
        if args.part in ("time", "all"):
            recording.write_subsection(DOC, SECTION, "### FedCDA aggregation time", stamp + (
                "One selection round (cache update, Eq. 8 searches, new global model), median "
                "of the repeats, N = 2P clients with full caches (RAM), against FedAvg's "
                "aggregation of the same P updates:\n\n") + "\n".join(rows) + "\n")
        if args.part in ("memory", "all"):
            recording.write_subsection(DOC, SECTION, "### FedCDA server memory", stamp + (
                "Peak resident memory of a fresh server process that fills the caches of N "
                "clients (K = 3 each, 20 per round) and runs selection rounds:\n\n")
                + "\n".join(mem) + "\n")
        if args.part in ("gram", "all"):
            recording.write_subsection(
                DOC, SECTION, "### FedCDA Gram step, other ways to compute it", stamp + (
                "Candidates are ResNet-18-size float32 vectors (63 = K x P, three batches of "
                "21); times are the best of the repeats:\n\n") + "\n".join(gram_rows) + "\n")



if __name__ == "__main__":
    main()
