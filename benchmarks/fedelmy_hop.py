"""Cost of one FedELMY hop against a FedSeq hop: time and peak memory, side by side.

Each case runs in a fresh process (so peak memory is its own), trains one client's hop
with the trainer the chain would send it, and reports wall time (torch on 1 thread, as
a simulated client) and the peak resident memory *above* the process's memory just
before training (data and model loaded), sampled every 2 ms.

Cases (``--model fmnist-cnn``: client 0 of the Fashion-MNIST Dirichlet 0.5 split of
``configs/fedelmy-dir0.5.yaml``, E_local = 1):

* ``fedseq E=1``: FedSeq with FedELMY's per-model epochs;
* ``fedseq E=S``: FedSeq with FedELMY's total epochs (compute-matched);
* ``fedelmy paper``: the pool of S = 5, paper form (keeps every pool model's
  trainable vector as an anchor: O(S) copies);
* ``fedelmy code``: the official code's form, closed-form gradient (O(1) copies).

``--model wide-mlp`` (3072 -> 4096 -> 10, 12.6 M parameters, 50 MB per copy, 96
synthetic 3 x 32 x 32 images, 2 steps per model) makes parameters all of the memory,
so the copies each form keeps show as multiples of the model size; its times are not
meaningful.  Large blocks are mmapped (``MALLOC_MMAP_THRESHOLD_``), so freed copies
leave the resident set and the peak counts live copies.

Usage::

    python benchmarks/fedelmy_hop.py [--model fmnist-cnn|wide-mlp] [--pool 5] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ["fedseq E=1", "fedseq E=S", "fedelmy paper", "fedelmy code"]


def rss() -> int:
    """Resident memory of this process in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(case: str, model_name: str, pool: int) -> dict[str, float]:
    """Run one case in this process; its time and peak extra memory."""
    import torch

    from clients import TRAINERS
    from clients.base import LocalConfig, TrainJob
    from fedsys.models import build_model
    from fedsys.options import parse_group
    from fedsys.params import from_torch, num_bytes
    from fedsys.task import client_data, dataset
    from launch.registry import load

    torch.set_num_threads(1)
    if model_name == "fmnist-cnn":
        cfg = load(ROOT / "configs" / "fedelmy-dir0.5.yaml")
        ds = dataset(cfg)
        x, y = client_data(cfg, 0)
        shape, steps = ds.input_shape, 0
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
    name = case.split()[0]
    trainer = TRAINERS[name]
    given: dict[str, int | str] = {f"{name}.pool-size": pool} if name == "fedelmy" else {}
    if name == "fedelmy":
        given[f"{name}.form"] = case.split()[1]
    options = parse_group(trainer.Options, trainer.prefix(), given)
    epochs = pool if case == "fedseq E=S" else 1
    max_steps = steps * (pool if case == "fedseq E=S" else 1)
    job = TrainJob(net, x, y, norm, LocalConfig(epochs=epochs, batch_size=64 if steps else 128,
                                                lr=1e-3, weight_decay=1e-4, seed=1,
                                                max_steps=max_steps), options,
                   run_seed=0, partition_id=0)
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="fmnist-cnn", choices=("fmnist-cnn", "wide-mlp"))
    ap.add_argument("--pool", type=int, default=5, help="S, the pool size (default 5)")
    ap.add_argument("--record", action="store_true", help="append the table to docs/performance.md")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one(args.case, args.model, args.pool)))
        return
    rows = {}
    for case in CASES:
        out = subprocess.run([sys.executable, __file__, "--case", case, "--model", args.model,
                              "--pool", str(args.pool)], capture_output=True, text=True,
                             check=True, cwd=ROOT,
                             env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
        rows[case] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{case:14} {rows[case]['seconds']:8.1f} s  peak +{rows[case]['peak_mb']:7.1f} MB",
              flush=True)
    ref = rows["fedseq E=1"]
    size = ref["model_mb"]
    lines = [
        "| case | time s | time / FedSeq E=1 | peak extra MB | (peak - FedSeq E=1) / model size |",
        "|---|---:|---:|---:|---:|",
    ]
    for case, r in rows.items():
        lines.append(f"| {case.replace('S', str(args.pool)) if case == 'fedseq E=S' else case} "
                     f"| {r['seconds']:.1f} | {r['seconds'] / ref['seconds']:.2f} "
                     f"| {r['peak_mb']:.1f} | {(r['peak_mb'] - ref['peak_mb']) / size:+.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        cmd = f"python benchmarks/fedelmy_hop.py --model {args.model} --pool {args.pool} --record"
        what = ("client 0 of configs/fedelmy-dir0.5.yaml (Fashion-MNIST, FMNIST CNN, E_local = 1)"
                if args.model == "fmnist-cnn" else
                "a wide MLP (12.6 M parameters), 96 synthetic 3x32x32 images, 2 steps per "
                "model (memory only)")
        text = (f"\n## One FedELMY hop against a FedSeq hop, S = {args.pool} ({args.model})\n\n"
                f"Command: `{cmd}`  \n"
                f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                f"torch on 1 thread (a simulated client); model {size:.2f} MB; {what}.\n\n"
                f"{table}\n")
        doc = ROOT / "docs" / "performance.md"
        doc.write_text(doc.read_text() + text)
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
