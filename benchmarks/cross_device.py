"""Round time of a cross-device federation on each simulation engine, against the floor.

``configs/cross-device.yaml`` (1,000 IID Fashion-MNIST clients of 60 samples, 100 a round,
the MLP, one local epoch of SGD at batch 32), or with ``--cnn`` the FMNIST CNN on 100
clients of 600 samples, all 100 a round.  One run each, one after the other, each a fresh
``fedsys run`` process as a user starts it:

- ``flower``: Flower's simulation engine (Ray actors behind an in-process SuperLink);
- ``inprocess``, one client at a time (``batch-clients=false``);
- ``inprocess``, batched (the round's clients trained together, ``clients/batched.py``);
- ``inprocess``, batched, under glibc's default heap (``GLIBC_TUNABLES=""``: the command
  then leaves the heap alone, ``fedsys_launch/process/heap.py``): what keeping freed memory gives;
- with ``--ray-nodes K``, also ``inprocess`` batched on a Ray cluster of K nodes on
  127.0.0.1 (``ray start --head`` and K-1 ``ray start --address``, one CPU each; config key
  ``ray-address``, ``fedsys_launch/engines/ray_training_workers.py``): what sending the shares to workers costs;
- the floor: a plain PyTorch loop in this process, one thread, training the same clients
  on the same data one after another (``torch.optim.SGD``, the weighted mean after), with
  no evaluation, no messages, no checkpoints; its heap set as the ``fedsys`` command sets
  its own (``fedsys_launch.process.heap.keep_freed_memory``), so that the floor and the engines
  allocate alike;
- the floor of a round with real messages: the same loop, the broadcast model written to
  an ``ArrayRecord`` and read back once for all the round's clients, and each client's
  trained model sent back as one (Flower's ``Array``,
  the bytes of ``numpy.save``; the engines send real ``Message`` objects), read
  back on the server; and with that, the round's central evaluation on ``test-subset``
  images, which every engine's ``round-time`` includes: what no engine that keeps Flower's
  messages and evaluates every round can go below.

It prints per engine the median ``round-time`` of rounds 2.. (the run's own wall clock of
a round: training, aggregation, central evaluation on ``test-subset`` images, the
checkpoint), its ratio to the floor's round, and the driver's peak RSS (``VmHWM``, sampled;
the Flower engine's actors are other processes).  ``--clients N`` runs the federation with
N clients (same 100 a round) to see whether cost grows with the federation; Fashion-MNIST
has 60,000 training images, so 100,000 clients need a larger dataset of one's own
(``--set dataset=custom --set data-dir=DIR``, ``scripts/tiled_fmnist.py`` writes one).

Usage::

    python benchmarks/cross_device.py --out /tmp/xdev
    python benchmarks/cross_device.py --cnn --rounds 3 --out /tmp/xdev-cnn
    python benchmarks/cross_device.py --ray-nodes 2 --only inprocess-batched,inprocess-ray
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cross-device.yaml"
CNN = ["model=fmnist-cnn", "num-clients=100", "clients-per-round=100", "lr=0.01"]
VARIANTS = {
    "flower": ["engine=flower"],
    "inprocess-one": ["engine=inprocess", "batch-clients=false"],
    "inprocess-batched": ["engine=inprocess", "batch-clients=true"],
    "inprocess-batched-default-heap": ["engine=inprocess", "batch-clients=true"],
}
#: each variant's environment besides this process's
VARIANT_ENV = {"inprocess-batched-default-heap": {"GLIBC_TUNABLES": ""}}
FLOOR = "floor: plain PyTorch loop, one thread"


def peak_rss_mib(pid: int) -> float:
    """``pid``'s peak resident set (``VmHWM``) in MiB, 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_fedsys(sets: list[str], out: Path, env: dict[str, str] | None = None
               ) -> tuple[list[float], float, float, float]:
    """Round times (rounds 1..), whole wall seconds, the driver's peak RSS and the
    training samples of a round (the rounds' median ``trained-examples``) of one ``fedsys
    run`` of the cross-device config with ``sets`` (``env`` added to this process's
    environment)."""

    cmd = [sys.executable, "-m", "fedsys_launch", "run", str(CONFIG), *(f"--set={s}" for s in sets),
           f"--set=output-dir={out}", "--set=name=xdev"]
    out.mkdir(parents=True, exist_ok=True)
    t0, peak = time.perf_counter(), 0.0
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        while proc.poll() is None:
            peak = max(peak, peak_rss_mib(proc.pid))
            time.sleep(0.2)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"fedsys run failed (exit {proc.returncode}): see {out / 'log.txt'}")
    recs = [json.loads(line) for line in (out / "xdev" / "fedavg" / "metrics.jsonl")
            .read_text().splitlines() if line.strip()]
    rounds = [r for r in recs if int(r["round"]) >= 1]
    return ([float(r["round-time"]) for r in rounds], wall, peak,
            statistics.median(float(r.get("trained-examples", "nan")) for r in rounds))


def floor(sets: list[str], rounds: int, messages: bool = False, evaluate: bool = False
          ) -> tuple[list[float], int]:
    """Round times of the plain PyTorch loop, and the samples a round trains: the
    config's sampled clients' data, trained one after another from the global model,
    then their example-weighted mean; with ``messages`` each client reads the broadcast
    model from an ``ArrayRecord`` and sends its trained model back as one, which the
    server reads; with ``evaluate`` the new global model is scored on the central test
    split.  On the config's ``device`` (``--set device=cuda``: the model and every
    client's data there from the start, normalised there, each round's time taken after
    the device has finished it)."""
    import numpy as np
    import torch

    from fedsys import protocol
    from fedsys.models import build_model
    from fedsys.params import from_torch, to_torch
    from fedsys.task import client_data, dataset, pick_device, score, test_sets
    from fedsys_launch.config_schema import load

    torch.set_num_threads(1)
    cfg = load(CONFIG, sets)
    ds = dataset(cfg)
    device = pick_device(cfg.device)
    data = [tuple(t.to(device) for t in client_data(cfg, pid, cfg.num_clients))
            for pid in range(cfg.num_clients)]
    def done() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    net = build_model(cfg.model, ds.input_shape, ds.num_classes, cfg.seed, cfg.model_norm).to(device)
    global_w = {k: v.clone() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(cfg.seed)
    times, samples = [], 0
    (_, x_test, y_test), = test_sets(cfg)[:1]
    x_test, y_test = x_test.to(device), y_test.to(device)
    for _ in range(rounds):
        t0, samples = done(), 0
        total = {k: torch.zeros_like(v) for k, v in global_w.items()}
        n_all = 0
        # the broadcast, read once for all the round's clients (the least a reader does)
        start = ({k: v.to(device) for k, v in to_torch(protocol.from_record(
            protocol.to_record(from_torch(global_w)))).items()} if messages else global_w)
        for pid in rng.choice(cfg.num_clients, cfg.clients_per_round, replace=False):
            x, y = data[int(pid)]
            net.load_state_dict(start)
            opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum)
            for _ in range(cfg.local_epochs):
                perm = torch.randperm(len(y), device=device)
                for i in range(0, len(y), cfg.batch_size):
                    idx = perm[i:i + cfg.batch_size]
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(net(ds.normalise(x[idx])), y[idx]).backward()
                    opt.step()
                samples += len(y)
            trained = net.state_dict()
            if messages:  # the reply's ArrayRecord, read back on the server
                trained = {k: v.to(device) for k, v in to_torch(protocol.from_record(
                    protocol.to_record(from_torch(trained)))).items()}
            for k, v in trained.items():
                total[k] += v * len(y)
            n_all += len(y)
        global_w = {k: v / n_all for k, v in total.items()}
        if evaluate:
            net.load_state_dict(global_w)
            score(net, ds.normalise, x_test, y_test, cfg.eval_batch_size, device)
            net.train()
        times.append(done() - t0)
    return times, samples


def main() -> None:
    """Run the engines and the floor, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cnn", action="store_true", help="the FMNIST CNN, 100 clients of 600")
    ap.add_argument("--clients", type=int, default=0, help="num-clients (default: the config's)")
    ap.add_argument("--only", default="", help=f"comma-separated variants of {', '.join(VARIANTS)} "
                    "(default: all)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/fedsys-cross-device"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another config key for every run and the floor (e.g. dataset=custom)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes of the floors and the engines, one after the other: the table "
                         "gives each row's median over the passes and its ratio to the floor of "
                         "the same pass, each pass's ratio beside (a busy machine drifts)")
    ap.add_argument("--ray-nodes", type=int, default=0,
                    help="also run inprocess-ray on a local Ray cluster of this many nodes")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more passes")
    from fedsys_launch.process.heap import keep_freed_memory

    keep_freed_memory(os.environ)  # the floor's heap as the command sets its own
    sets = [*(CNN if args.cnn else []), f"num-server-rounds={args.rounds}",
            *([f"num-clients={args.clients}"] if args.clients else []), *args.set]
    with contextlib.ExitStack() as stack:
        variants = {k: v for k, v in VARIANTS.items()
                    if not args.only or k in args.only.split(",")}
        if args.ray_nodes > 0:
            from fedsys_launch.engines.shared_ray_cluster import ray_cluster, ray_node

            root = Path(tempfile.mkdtemp(prefix="fedsys-xr-"))  # short: Ray's socket paths
            stack.callback(shutil.rmtree, root, ignore_errors=True)
            address = stack.enter_context(ray_cluster(root / "head", num_cpus=1))
            for k in range(1, args.ray_nodes):
                stack.enter_context(ray_node(address, root / f"node{k}", num_cpus=1))
            variants["inprocess-ray"] = [*VARIANTS["inprocess-batched"], f"ray-address={address}"]
        passes = [one_pass(sets, args, variants, k) for k in range(args.repeat)]
    print("\n| engine | round s (median, rounds 2..) | / floor | samples/s | whole run s | "
          "driver peak RSS MiB |" + (" / floor, each pass |" if args.repeat > 1 else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---|" if args.repeat > 1 else ""))

    def cell(v: float, fmt: str) -> str:
        return "-" if v != v else format(v, fmt)  # nan: not measured (the floors)

    for name in passes[0]:
        rts = [p[name][0] for p in passes]
        ratios = [p[name][0] / p[FLOOR][0] for p in passes]
        walls, peaks = [p[name][1] for p in passes], [p[name][2] for p in passes]
        rates = [p[name][3] for p in passes]
        each = (" " + ", ".join(f"{r:.2f}" for r in ratios) + " |") if args.repeat > 1 else ""
        print(f"| {name} | {statistics.median(rts):.3f} | {statistics.median(ratios):.2f} | "
              f"{statistics.median(rates):,.0f} | {cell(statistics.median(walls), '.1f')} | "
              f"{cell(statistics.median(peaks), '.0f')} |{each}")


Row = tuple[float, float, float, float]  #: round s, wall s, peak RSS MiB, samples a second


def one_pass(sets: list[str], args: argparse.Namespace, variants: dict[str, list[str]],
             k: int) -> dict[str, Row]:
    """The floors, then each engine, one after the other: per row its median round time
    (rounds 2..), whole wall seconds, driver peak RSS (nan for the floors) and training
    samples a second (a round's samples over its median round time)."""
    nan = float("nan")
    rows: dict[str, Row] = {}
    for label, kw in ((FLOOR, {}), ("floor + Flower's messages", {"messages": True}),
                      ("floor + messages + central evaluation", {"messages": True, "evaluate": True})):
        times, n = floor(sets, args.rounds, **kw)
        rt = statistics.median(times[1:] or times)
        rows[label] = (rt, nan, nan, n / rt)
        print(f"[pass {k + 1}] {label}: {rt:.3f} s a round", flush=True)
    for name, extra in variants.items():
        times, wall, peak, samples = run_fedsys([*sets, *extra], args.out.resolve() / f"{name}-{k}",
                                                VARIANT_ENV.get(name))
        rt = statistics.median(times[1:] or times)
        rows[name] = (rt, wall, peak, samples / rt)
        print(f"[pass {k + 1}] {name}: {rt:.3f} s a round ({wall:.1f} s wall, "
              f"{peak:.0f} MiB)", flush=True)
    return rows


if __name__ == "__main__":
    main()
