"""Flower overhead: the same local training as a plain PyTorch loop and as Flower rounds.

Work per round: 4 clients, each holding an iid quarter of Fashion-MNIST's training
set, train the FMNIST CNN for 1 local epoch; the global model is averaged and
evaluated on the same 2000 test samples.

* ``plain``: one process, clients trained one after another with torch using all
  cores, FedAvg by :func:`fedsys.params.mean`, central evaluation.
* ``flower``: ``fedsys run`` machinery (Flower simulation engine, Ray actors with
  one core each), identical config and seed.

It prints a table and the ratio flower/plain, per steady round and for the whole
run including engine start-up, and appends the result with its command to
``docs/performance.md`` when ``--record`` is given.

Usage::

    python benchmarks/overhead.py [--rounds 3] [--record]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clients.base import LocalConfig, TrainJob  # noqa: E402
from clients.sgd import SGDTrainer  # noqa: E402
from fedsys import metrics  # noqa: E402
from fedsys.config import RunConfig  # noqa: E402
from fedsys.params import from_torch, mean, to_torch  # noqa: E402
from fedsys.seeding import derive_seed  # noqa: E402
from fedsys.task import dataset, evaluate, model, partitions  # noqa: E402
from fedsys_launch import recording  # noqa: E402
from fedsys_launch.config_schema import build  # noqa: E402


def plain(cfg: RunConfig) -> list[float]:
    """Per-round wall times of the same work as a plain PyTorch loop."""
    torch.set_num_threads(os.cpu_count() or 1)
    ds = dataset(cfg)
    parts = partitions(cfg)
    net = model(cfg, ds)
    glob = from_torch(net.state_dict())
    n = cfg.test_subset or len(ds.y_test)
    times = []
    for rnd in range(1, cfg.num_server_rounds + 1):
        t0 = time.perf_counter()
        ups, ws = [], []
        for pid in range(cfg.num_clients):
            net.load_state_dict(to_torch(glob))
            idx = torch.from_numpy(parts[pid])
            res = SGDTrainer().train(TrainJob(
                net, ds.x_train[idx], ds.y_train[idx], ds.normalise, LocalConfig(
                    epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                    seed=derive_seed(cfg.seed, rnd, pid))))
            ups.append(from_torch(net.state_dict()))
            ws.append(res.num_examples)
        glob = mean(ups, ws)
        net.load_state_dict(to_torch(glob))
        evaluate(net, ds, ds.x_test[:n], ds.y_test[:n], cfg.eval_batch_size, torch.device("cpu"))
        times.append(time.perf_counter() - t0)
    return times


def flower(cfg: RunConfig) -> tuple[list[float], float]:
    """Per-round times (from the run's metrics) and total wall time, Flower simulation."""
    from fedsys_launch.engines.simulation import simulate

    t0 = time.perf_counter()
    simulate(cfg)
    total = time.perf_counter() - t0
    recs = metrics.read_jsonl(cfg.run_dir / "fedavg" / "metrics.jsonl")
    bad = [r for r in recs if r["round"] > 0 and r.get("clients-ok") != cfg.clients_per_round]
    if bad:
        raise SystemExit(f"benchmark invalid: some client replies were rejected: {bad}")
    return [float(r["round-time"]) for r in recs if r["round"] > 0], total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="append the result to docs/performance.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = build({"name": "overhead", "output-dir": tmp, "strategy": "fedavg",
                     "dataset": "fashion-mnist", "model": "fmnist-cnn", "num-clients": 4,
                     "clients-per-round": 4, "partition": "iid", "local-epochs": 1,
                     "num-server-rounds": args.rounds, "test-subset": 2000, "seed": 0})
        t0 = time.perf_counter()
        p = plain(cfg)
        p_total = time.perf_counter() - t0
        f, f_total = flower(cfg)
    steady_p = sum(p[1:]) / max(len(p) - 1, 1)
    steady_f = sum(f[1:]) / max(len(f) - 1, 1)
    rows = [
        ("steady round (rounds 2..)", steady_p, steady_f),
        ("first round", p[0], f[0]),
        (f"whole run ({args.rounds} rounds, incl. start-up)", p_total, f_total),
    ]
    lines = ["| measure | plain PyTorch s | Flower simulation s | ratio flower/plain |",
             "|---|---:|---:|---:|"]
    lines += [f"| {m} | {a:.2f} | {b:.2f} | {b / a:.2f} |" for m, a, b in rows]
    table = "\n".join(lines)
    print(table)
    if args.record:
        cmd = "python benchmarks/overhead.py " + " ".join(sys.argv[1:])
        doc = ROOT / "docs" / "performance.md"
        recording.record_section(
            doc, "## Flower overhead (FMNIST CNN, 4 clients, 1 local epoch, iid, 2000 test samples)",
            cmd, f"{table}\n", f"torch {torch.__version__}")
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
