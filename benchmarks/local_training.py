"""Cost of a method's local training against plain local training: time and peak memory,
side by side in one run.

Each case runs in a fresh process (so peak memory is its own), trains one client's round
(or hop) with the trainer the method sends it, and reports wall time (torch on 1 thread,
as a simulated client) and the peak resident memory *above* the process's memory just
before training (data and model loaded), sampled every 2 ms.  Large blocks are mmapped
(``MALLOC_MMAP_THRESHOLD_``), so freed copies leave the resident set and the peak counts
live copies.

``--method fedelmy`` (S = ``--pool``; client 0 of ``configs/fedelmy-dir0.5.yaml``):
``fedseq E=1`` (FedELMY's per-model epochs), ``fedseq E=S`` (its total epochs), the
pool in the paper form (every pool model but the last kept as an anchor: O(S) copies)
and in the code form (closed-form gradient: O(1) copies).

``--method lss`` (N = ``--pool``; client 0 of ``configs/lss-fmnist.yaml``): Adam
local training (FedAvg's) for 1 and N epochs, LSS at the paper's protocol (N
ingredients of 1 epoch), at equal compute (N ingredients of 1/N epoch) and in the code
form.

``--model wide-mlp`` (3072 -> 4096 -> 10, 12.6 M parameters, 50 MB per copy, 96
synthetic 3 x 32 x 32 images, 2 steps per model) makes parameters all of the memory, so
the copies each form keeps show as multiples of the model size; its times are not
meaningful.

Usage::

    python benchmarks/local_training.py --method fedelmy|lss [--model fmnist-cnn|wide-mlp]
        [--pool 5] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Per method: case label -> (trainer, options, epochs as a multiple of 1 or of the pool,
#: steps per model as a fraction of an epoch (1: whole epochs)).
CASES: dict[str, dict[str, tuple[str, dict[str, str], str, str]]] = {
    "fedelmy": {
        "fedseq E=1": ("fedseq", {}, "1", "1"),
        "fedseq E=S": ("fedseq", {}, "pool", "1"),
        "fedelmy paper": ("fedelmy", {"form": "paper"}, "1", "1"),
        "fedelmy code": ("fedelmy", {"form": "code"}, "1", "1"),
    },
    "lss": {
        "adam E=1": ("sgd", {}, "1", "1"),
        "adam E=N": ("sgd", {}, "pool", "1"),
        "lss paper": ("lss", {"form": "paper"}, "1", "1"),
        "lss equal compute": ("lss", {"form": "paper"}, "1", "1/pool"),
        "lss code": ("lss", {"form": "code", "accumulation": "1"}, "1", "1"),
    },
}
PRESET = {"fedelmy": "fedelmy-dir0.5.yaml", "lss": "lss-fmnist.yaml"}
POOL_KEY = {"fedelmy": "pool-size", "lss": "ingredients"}


def rss() -> int:
    """Resident memory of this process in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(method: str, case: str, model_name: str, pool: int) -> dict[str, float]:
    """Run one case in this process; its time and peak extra memory."""
    import math

    import torch

    from clients import TRAINERS
    from clients.base import LocalConfig, TrainJob
    from fedsys.models import build_model
    from fedsys.options import parse_group
    from fedsys.params import from_torch, num_bytes
    from fedsys.task import client_data, dataset
    from fedsys_launch.config_schema import load

    torch.set_num_threads(1)
    cfg = load(ROOT / "configs" / PRESET[method])
    if model_name == "fmnist-cnn":
        ds = dataset(cfg)
        x, y = client_data(cfg, 0)
        shape, steps = ds.input_shape, math.ceil(len(y) / cfg.batch_size)
        norm: Callable[[torch.Tensor], torch.Tensor] = ds.normalise
    else:
        from torch import nn

        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 255, (96, 3, 32, 32), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (96,), generator=g)
        shape, steps = (3, 32, 32), 2

        def scaled(b: torch.Tensor) -> torch.Tensor:
            return b.float() / 255

        norm = scaled

    net = (build_model(model_name, shape, 10, 0) if model_name == "fmnist-cnn" else
           nn.Sequential(nn.Flatten(), nn.Linear(3072, 4096), nn.ReLU(), nn.Linear(4096, 10)))
    size = num_bytes(from_torch(net.state_dict()))
    name, opts, epochs_rule, steps_rule = CASES[method][case]
    trainer = TRAINERS[name]
    given: dict[str, int | str] = {f"{name}.{k}": v for k, v in opts.items()}
    if name in ("fedelmy", "lss"):
        given[f"{name}.{POOL_KEY[method]}"] = pool
    options = parse_group(trainer.Options, trainer.prefix(), given)
    epochs = pool if epochs_rule == "pool" else 1
    per_model = max(1, steps // pool) if steps_rule == "1/pool" else steps
    cap = per_model * epochs if model_name != "fmnist-cnn" or steps_rule != "1" else 0
    job = TrainJob(net, x, y, norm, LocalConfig(
        epochs=epochs, batch_size=cfg.batch_size if model_name == "fmnist-cnn" else 64,
        lr=cfg.lr, weight_decay=cfg.weight_decay, seed=1, max_steps=cap,
        optimizer="adam"), options, run_seed=0, partition_id=0)
    base, peak, stop = rss(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    trainer().train(job)
    secs = time.perf_counter() - t0
    stop.set()
    t.join()
    peak[0] = max(peak[0], rss())
    return {"seconds": secs, "peak_mb": (peak[0] - base) / 2**20, "model_mb": size / 2**20}


def main() -> None:
    """Run every case in its own process and print (and optionally record) the table."""
    from fedsys_launch.recording import record_section

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="fedelmy", choices=tuple(CASES))
    ap.add_argument("--model", default="fmnist-cnn", choices=("fmnist-cnn", "wide-mlp"))
    ap.add_argument("--pool", type=int, default=5, help="S or N, the pool size (default 5)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/performance.md")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one(args.method, args.case, args.model, args.pool)))
        return
    rows = {}
    for case in CASES[args.method]:
        out = subprocess.run([sys.executable, __file__, "--method", args.method, "--case", case,
                              "--model", args.model, "--pool", str(args.pool)],
                             capture_output=True, text=True, check=True, cwd=ROOT,
                             env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
        rows[case] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{case:18} {rows[case]['seconds']:8.1f} s  peak +{rows[case]['peak_mb']:7.1f} MB",
              flush=True)
    first = next(iter(rows))
    ref = rows[first]
    size = ref["model_mb"]
    letter = "S" if args.method == "fedelmy" else "N"
    lines = [f"| case | time s | time / {first} | peak extra MB | (peak - {first}) / model size |",
             "|---|---:|---:|---:|---:|"]
    for case, r in rows.items():
        lines.append(f"| {case.replace(f'E={letter}', f'E={args.pool}')} | {r['seconds']:.1f} "
                     f"| {r['seconds'] / ref['seconds']:.2f} | {r['peak_mb']:.1f} "
                     f"| {(r['peak_mb'] - ref['peak_mb']) / size:+.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        cmd = (f"python benchmarks/local_training.py --method {args.method} --model {args.model} "
               f"--pool {args.pool} --record")
        what = (f"client 0 of configs/{PRESET[args.method]}" if args.model == "fmnist-cnn" else
                "a wide MLP (12.6 M parameters), 96 synthetic 3x32x32 images, 2 steps per "
                "model (memory only)")
        head = f"## {args.method} local training, {letter} = {args.pool} ({args.model})"
        doc = ROOT / "docs" / "performance.md"
        record_section(doc, head, cmd, f"Model {size:.2f} MB; {what}.\n\n{table}\n",
                       "torch on 1 thread (a simulated client)")
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
