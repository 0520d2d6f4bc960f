"""FedCross server cost: one cross-aggregation round against FedAvg, and bytes sent.

For K middleware models (K = clients per round) in {10, 50, 100}, one round of
:meth:`strategies.fedcross.FedCrossStrategy.aggregate` (similarity from the K x K Gram
matrix, lowest-similarity selection, mixing, uniform mean of the K slots, metrics) is
timed against :meth:`strategies.fedavg.FedAvgStrategy.aggregate`
(:func:`fedsys.params.mean`) on the same K uploads, for the FMNIST
CNN (582,026 parameters) and ResNet-18 (11.2 M).  The uploads are seeded random
perturbations of one initial model (no training: only the server's arithmetic is
measured).  The FedCross time is also split into its two parts, timed separately
with the functions the strategy calls: the similarities (:func:`fedsys.fedcross.similarity`)
and the mixing with the global mean (:func:`fedsys.fedcross.cross_aggregate`).

Bytes sent per round are summed over the payloads the two strategies build for K
nodes (``payload_for``): FedCross sends each node its own slot, FedAvg the global
model; both are K models down (and K up), so the two must be equal.

Usage::

    python benchmarks/fedcross_agg.py [--models fmnist-cnn,resnet18] [--ks 10,50,100]
                                      [--repeats 3] [--record]

On cores shared with other busy processes, run it with ``OPENBLAS_NUM_THREADS=1``
(spinning BLAS threads are then many times slower than one).  K = 100 at ResNet-18
size holds about 9 GB of models (K uploads and K slots).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
#: Where --record writes: subsections of "## FedCross aggregation" in docs/performance.md.
DOC, SECTION = ROOT / "docs" / "performance.md", "## FedCross aggregation"
sys.path.insert(0, str(ROOT))

from fedsys import fedcross as maths  # noqa: E402
from fedsys.models import build_model  # noqa: E402
from fedsys.params import Params, from_torch, num_bytes  # noqa: E402
from fedsys.validation import ClientUpdate  # noqa: E402
from fedsys_launch import recording  # noqa: E402
from fedsys_launch.config_schema import build  # noqa: E402
from strategies.fedavg import FedAvgStrategy  # noqa: E402
from strategies.fedcross import FedCrossStrategy  # noqa: E402

MODELS = {"fmnist-cnn": ("fmnist-cnn", 1, 28), "resnet18": ("resnet18", 3, 32)}
TARGET = ("resnet18", 100, 2.0)  # model, K, seconds


def base_model(name: str) -> Params:
    arch, ch, size = MODELS[name]
    return from_torch(build_model(arch, (ch, size, size), 10, seed=0).state_dict())


def uploads(base: Params, k: int, seed: int = 0) -> list[ClientUpdate]:
    """K distinct float32 models: base + a_i * n1 + b_i * n2 (two seeded noise models)."""
    rng = np.random.default_rng(seed)
    noise = [{key: rng.standard_normal(v.shape, dtype=np.float32) * 0.01
              for key, v in base.items() if v.dtype.kind == "f"} for _ in range(2)]
    out = []
    for i in range(k):
        a, b = (float(x) for x in rng.normal(size=2))
        p: Params = {}
        for key, v in base.items():
            if v.dtype.kind == "f":
                p[key] = (np.asarray(v, np.float64) + a * noise[0][key] + b * noise[1][key]).astype(v.dtype)
            else:
                p[key] = v + i
        out.append(ClientUpdate(i, i, p, 100 + i, {"train-loss": 1.0}))
    return out


def time_case(model: str, k: int, repeats: int) -> dict[str, float]:
    base = base_model(model)
    ups = uploads(base, k)
    cfg = build({"strategy": "fedcross", "num-clients": k, "clients-per-round": k})
    cross, avg = FedCrossStrategy.from_config(cfg), FedAvgStrategy.from_config(cfg)
    cross.params = avg.params = base
    cross._ensure_slots()
    cross.assignment = {i: i for i in range(k)}
    sent_cross = sum(num_bytes(cross.payload_for(i, i, 1)) for i in range(k))
    sent_avg = sum(num_bytes(avg.payload_for(i, i, 1)) for i in range(k))
    t: dict[str, list[float]] = {"fedavg": [], "fedcross": [], "sim": [], "mix": []}
    models = [u.params for u in ups]
    by_slot = dict(enumerate(models))
    for rnd in range(2, 2 + repeats):
        t0 = time.perf_counter()
        avg.aggregate(rnd, ups)
        t["fedavg"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cross.aggregate(rnd, ups)
        t["fedcross"].append(time.perf_counter() - t0)
        # the two parts, with the functions the strategy calls
        t0 = time.perf_counter()
        sim, _ = maths.similarity(models)
        t["sim"].append(time.perf_counter() - t0)
        a = maths.cross_matrix(maths.select_collaborators(sim, "lowest", rnd), 0.99)
        t0 = time.perf_counter()
        maths.cross_aggregate(cross.slots, by_slot, a)
        t["mix"].append(time.perf_counter() - t0)
    res = {key: float(np.median(v)) for key, v in t.items()}
    res.update(params=float(sum(v.size for v in base.values() if v.dtype.kind == "f")),
               sent_cross=float(sent_cross), sent_avg=float(sent_avg))
    if sent_cross != sent_avg:
        raise AssertionError(f"bytes sent differ: FedCross {sent_cross}, FedAvg {sent_avg}")
    return res



def floor(k: int, repeats: int) -> list[str]:
    """What any exact FedCross round must at least do at ResNet-18 size, timed alone.

    On K flat float32 vectors of ResNet-18's trainable size: (a) the Gram products alone,
    numpy's syrk over column blocks that are already in place (no gathering, no
    anchoring), summed in float64; (b) the same with the shipped anchored gathering
    (:func:`fedsys.fedcross.gram`); (c) writing K new models from K uploads, a plain
    copy, the least traffic the mixing can cause; (d) a float32 running sum of the K
    uploads, the least a mean can cost.  (a) + (c) is a floor for the whole round.
    (e) then runs a whole lowest-similarity round with the fewest passes over memory
    we found (:func:`minimal_round`), parts and total.
    """
    dim = sum(int(v.size) for k_, v in base_model("resnet18").items()
              if v.dtype.kind == "f" and not k_.endswith(maths.BUFFER_SUFFIXES))
    rng = np.random.default_rng(0)
    base = rng.standard_normal(dim, dtype=np.float32)
    rows_ = np.empty((k, dim), np.float32)
    for i in range(k):
        rows_[i] = base + np.float32(0.01) * rng.standard_normal(dim, dtype=np.float32)
    models: list[Params] = [{"w": rows_[i]} for i in range(k)]
    width = max(1024, maths.BLOCK_BYTES // (k * 4))
    out = np.empty_like(rows_)

    def syrk() -> None:
        block_gram(rows_, width)

    def copy() -> None:
        for i in range(k):
            np.copyto(out[i], rows_[i])

    def fsum() -> None:
        acc = np.zeros(dim, np.float32)
        for i in range(k):
            acc += rows_[i]

    cases = (("(a) Gram products alone (syrk on blocks in place)", syrk),
             ("(b) Gram with the shipped anchored gathering (fedsys.fedcross.gram)",
              lambda: maths.gram(models, ["w"])),
             ("(c) writing K new models (a copy of the K uploads)", copy),
             ("(d) float32 running sum of the K uploads", fsum))
    lines = [f"| step, K = {k}, {dim:,} float32 coordinates | best of {repeats} s |", "|---|---:|"]
    got = {}
    for label, fn in cases:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        got[label[:3]] = best
        lines.append(f"| {label} | {best:.3f} |")
        print(lines[-1], flush=True)
    lines.append(f"| floor of one round, (a) + (c) | {got['(a)'] + got['(c)']:.3f} |")
    print(lines[-1], flush=True)
    parts = min((minimal_round(rows_, 1 << 18) for _ in range(repeats)), key=lambda p: p[-1])
    for label, sec in zip(("(e1) its Gram products, blocks in place",
                           "(e2) its selection and the mean as one BLAS product",
                           "(e3) its mixing, in place, 2 torch threads",
                           "(e) a minimal exact round on one (K, D) matrix, (e1) + (e2) + (e3)"),
                          parts, strict=True):
        lines.append(f"| {label} | {sec:.3f} |")
        print(lines[-1], flush=True)
    return lines


def block_gram(rows_: np.ndarray, width: int) -> np.ndarray:
    """``rows_ @ rows_.T`` summed in float64 over column blocks taken in place (one syrk each)."""
    k = rows_.shape[0]
    g = np.zeros((k, k))
    for lo in range(0, rows_.shape[1], width):
        x = rows_[:, lo : lo + width]
        g += x @ x.T
    return g


def minimal_round(rows_: np.ndarray, width: int, alpha: float = 0.99) -> tuple[float, ...]:
    """One lowest-similarity round with the fewest passes over memory we found.

    The K uploads are rows of one float32 matrix (as if decoded straight into it);
    the Gram products run on column blocks in place without anchoring (plain float32
    products, float64 sums over blocks); the global model is the mean of the mixed
    slots, ``sum_j beta_j v_j / K`` with ``beta_j = alpha + (1 - alpha) * #{i: c(i) = j}``,
    one BLAS matrix-vector product taken before mixing; the mixing runs in place
    along the collaborator graph (a row is overwritten once every row that reads it
    is done; one saved row per cycle), with two torch threads.  No metrics, no
    checks, no anchoring: a lower bound for a real round, not a design fedsys ships.
    Returns the three parts and their sum, in seconds.
    """
    k = rows_.shape[0]
    t0 = time.perf_counter()
    g = block_gram(rows_, width)
    t1 = time.perf_counter()
    collab = maths.select_collaborators(maths.cosine(g), "lowest", 2)
    beta = (alpha + (1 - alpha) * np.bincount(collab, minlength=k)) / k
    _glob = beta.astype(np.float32) @ rows_
    t2 = time.perf_counter()
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    t = torch.from_numpy(rows_)
    keep = torch.empty(rows_.shape[1], dtype=t.dtype)
    waiting = np.bincount(collab, minlength=k)  # rows still to be read before overwriting
    done = np.zeros(k, dtype=bool)
    ready = [i for i in range(k) if waiting[i] == 0]
    while ready:
        i = ready.pop()
        torch.lerp(t[i], t[collab[i]], 1 - alpha, out=t[i])
        done[i] = True
        waiting[collab[i]] -= 1
        if waiting[collab[i]] == 0 and not done[collab[i]]:
            ready.append(int(collab[i]))
    for start in range(k):  # what is left are cycles
        if done[start]:
            continue
        keep.copy_(t[start])
        i = start
        while not done[i]:
            nxt = int(collab[i])
            torch.lerp(t[i], keep if nxt == start else t[nxt], 1 - alpha, out=t[i])
            done[i] = True
            i = nxt
    torch.set_num_threads(old)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t3 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="fmnist-cnn,resnet18")
    ap.add_argument("--ks", default="10,50,100")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="write the table to docs/performance.md")
    ap.add_argument("--floor", action="store_true",
                    help="instead: time the least work of one K = 100 round at ResNet-18 size")
    args = ap.parse_args()
    if args.floor:
        lines = floor(100, args.repeats)
        if args.record:
            cmd = "python benchmarks/fedcross_agg.py " + " ".join(sys.argv[1:])
            recording.write_subsection(DOC, SECTION, "### FedCross: the least a round costs on this CPU",
                                     recording.stamp(cmd) + "\n".join(lines) + "\n")
        return
    threads = (f"mixing with {maths.MIX_THREADS} torch thread(s), Gram products with numpy's "
               f"BLAS (OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    print(threads)
    rows = ["| model | parameters | K | FedAvg s | FedCross s | ratio FedCross/FedAvg | "
            "similarity s | mixing + mean s | MB sent FedAvg | MB sent FedCross |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    verdict = ""
    for model in args.models.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            r = time_case(model, k, args.repeats)
            line = (f"| {model} | {int(r['params']):,} | {k} | {r['fedavg']:.3f} | "
                    f"{r['fedcross']:.3f} | {r['fedcross'] / r['fedavg']:.2f} | {r['sim']:.3f} | "
                    f"{r['mix']:.3f} | {r['sent_avg'] / 2**20:.1f} | {r['sent_cross'] / 2**20:.1f} |")
            print(line, flush=True)
            rows.append(line)
            if (model, k) == TARGET[:2]:
                ok = "met" if r["fedcross"] < TARGET[2] else "NOT met"
                verdict = (f"Target (ResNet-18, K = 100, under {TARGET[2]:.0f} s): {ok}, "
                           f"{r['fedcross']:.2f} s.\n")
                print(verdict, end="")
    if args.record:
        env = ("OPENBLAS_NUM_THREADS=" + os.environ["OPENBLAS_NUM_THREADS"] + " "
               if "OPENBLAS_NUM_THREADS" in os.environ else "")
        cmd = env + "python benchmarks/fedcross_agg.py " + " ".join(sys.argv[1:])
        body = recording.stamp(cmd, f"torch {torch.__version__}", threads) + (
            "One aggregation round, median of the repeats: FedCross (K x K Gram matrix of "
            "the uploads, lowest-similarity selection, mixing written into the K slots, "
            "uniform mean of the slots, round metrics) against FedAvg's example-weighted "
            "mean of the same K uploads. The part columns time the similarity and the "
            "mixing-plus-mean functions alone. Bytes sent are the K payloads of one round "
            "(FedCross: each node its own slot; FedAvg: the global model), equal by "
            "construction and checked by the script.\n\n" + "\n".join(rows) + "\n\n" + verdict
        )
        recording.write_subsection(DOC, SECTION, "### FedCross aggregation time", body)


if __name__ == "__main__":
    main()
