"""The ``fedsys`` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsys import config as cfgmod
from fedsys import metrics
from fedsys_launch import config_schema
from fedsys_launch.commands.results import load_runs, table
from fedsys_launch.process import heap, stopping
from fedsys_launch.process.run_lock import holding

EPILOG = """examples:
  fedsys run configs/default.yaml                     every method on Fashion-MNIST
  fedsys run configs/default.yaml --set num-server-rounds=5 --set name=quick
  fedsys run configs/fedelmy-dir0.5.yaml              FedELMY's chain against FedSeq and one-shot baselines
  fedsys partition configs/fedelmy-domain.yaml        the domain-shift split, a transform per client
  fedsys run configs/fedcda-dir0.5.yaml --seeds 0,1,2  every strategy on 3 seeds: mean ± std
  fedsys resume runs/default                          continue an interrupted run
  fedsys compare runs/default runs/quick              one table, one plot
  fedsys partition configs/default.yaml               per-client class histogram
  fedsys data fetch fashion-mnist                     get the dataset
  fedsys landscape runs/ima --rounds 58 59 60          loss plane through three global models
  fedsys pretrain configs/lss-fmnist.yaml             a pre-trained start on held-out samples
  fedsys keys                                         every config key and its default
"""


def _preflight(cfg: cfgmod.RunConfig) -> None:
    """Fail fast, in this process, on missing data, impossible partitions, GPUs
    that are not there or, checked last, a Ray cluster that does not answer (Ray would
    wait for them forever)."""
    import torch

    from fedsys.task import dataset, initial_params, partitions
    from fedsys_launch.engines.simulation import ray_address_problem

    if (cfg.client_num_gpus > 0 or cfg.device == "cuda") and not torch.cuda.is_available():
        key = "client-num-gpus" if cfg.client_num_gpus > 0 else "device"
        raise cfgmod.ConfigError(
            f"config key '{key}' asks for a GPU but torch sees no CUDA device; "
            "use client-num-gpus=0 and device=auto (or cpu)")
    from fedsys_launch.apps import tracking

    tracking.check(cfg)
    dataset(cfg)
    partitions(cfg)
    for _, vcfg in cfg.variants():  # a saved start that does not fit fails here, not in Ray
        initial_params(vcfg)
    from fedsys_launch.apps import strategy_start

    for label, vcfg in cfg.variants():  # strategy-specific checks (search sizes, K >= 2, ...)
        strategy = config_schema.make_strategy(
            strategy_start.strategy_config(vcfg, cfg.run_dir / label))
        # a broken checkpoint, what it refers to (FedCDA's cached model files), the rounds
        # it logged, a branch's parent: found here, before any engine starts
        if note := strategy_start.check(vcfg, cfg.run_dir / label, strategy):
            print(f"fedsys: {label}: {note}", flush=True)
    # last: what is wrong with the config itself is said first (the in-process engine
    # uses Ray only where ray-address names a cluster, not for RAY_ADDRESS)
    if problem := (ray_address_problem(os.environ, configured=cfg.ray_address)
                   if cfg.engine != "inprocess" else
                   ray_address_problem({}, configured=cfg.ray_address)):
        raise cfgmod.ConfigError(problem)


def seed_config(cfg: cfgmod.RunConfig, seed: int) -> cfgmod.RunConfig:
    """One seed's run of a run over seeds: ``<output-dir>/<name>/seed-<k>/``, that seed,
    and ``branch-from`` with ``{seed}`` filled in."""
    changes: dict[str, Any] = {"seed": seed, "seeds": "", "name": f"seed-{seed}",
                               "output-dir": str(cfg.run_dir)}
    if cfg.branch_from:
        if "{seed}" not in cfg.branch_from:
            raise cfgmod.ConfigError("config key 'branch-from': with 'seeds', name each seed's "
                                     "checkpoint with {seed} (runs/parent/seed-{seed}/ima/"
                                     "checkpoint-r0050.pt)")
        changes["branch-from"] = cfg.branch_from.replace("{seed}", str(seed))
    return cfg.replace(**changes)


def run_seeds(args: argparse.Namespace, cfg: cfgmod.RunConfig, seeds: list[int]) -> int:
    """``fedsys run`` over seeds: every seed's run (each checked first), then one table
    and one figure across seeds."""
    per = [seed_config(cfg, k) for k in seeds]
    for scfg in per:
        _preflight(scfg)
    with holding(cfg.run_dir):
        cfg.save(cfg.run_dir / "config.yaml")
        t0 = time.time()
        for i, scfg in enumerate(per, 1):
            print(f"fedsys: seed {scfg.seed} ({i}/{len(per)})", flush=True)
            rc = cmd_run(args, scfg, checked=True)
            if rc != 0:
                print(f"  the run over seeds {seeds} stopped at seed {scfg.seed}; 'fedsys "
                      f"resume {cfg.run_dir}' continues it.", file=sys.stderr)
                return rc
    from fedsys_launch.commands.results import seeds_table, write_seeded

    runs = write_seeded(cfg.run_dir, cfg.name)
    seeds_table(runs, f"{cfg.name}: seeds {seeds} ({time.time() - t0:.0f} s)")
    print(f"results: {cfg.run_dir}/results.md, curves: {cfg.run_dir}/accuracy.png")
    return 0


def cmd_run(args: argparse.Namespace, cfg: cfgmod.RunConfig | None = None,
            checked: bool = False) -> int:
    """``fedsys run``: check the config, simulate, print the table."""
    if cfg is None:
        given = getattr(args, "seeds", None)
        if given is not None and not cfgmod.parse_seeds(given):
            raise cfgmod.ConfigError(f"--seeds {given!r} names no seed; give integers, e.g. 0,1,2")
        extra = [f"seeds={given}"] if given else []
        cfg = config_schema.load(Path(args.config) if args.config else None, [*(args.set or []), *extra])
    seeds = cfgmod.parse_seeds(cfg.seeds)
    if seeds:
        return run_seeds(args, cfg, seeds)
    if not checked:
        _preflight(cfg)
    with holding(cfg.run_dir):
        return simulate_and_report(args, cfg)


def simulate_and_report(args: argparse.Namespace, cfg: cfgmod.RunConfig) -> int:
    """One run in the simulation engine, then its table; a failed run says whether its
    checkpoints can continue it."""
    from fedsys_launch.engines.simulation import simulate

    t0 = time.time()
    print(f"fedsys: running {cfg.strategies} on {cfg.dataset} ({cfg.num_clients} clients, "
          f"{cfg.num_server_rounds} rounds) -> {cfg.run_dir}", flush=True)
    from strategies.base import NoUsableUpdateError

    try:
        simulate(cfg, verbose=args.verbose)
    except NoUsableUpdateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from fedsys import checkpoint

        usable = []
        for ck in cfg.run_dir.glob("*/checkpoint.pt"):
            try:
                checkpoint.load_latest(ck)
                usable.append(ck)
            except checkpoint.CheckpointError:
                pass
        advice = (f"checkpoints are in {cfg.run_dir}; 'fedsys resume {cfg.run_dir}' continues it."
                  if usable else "no usable checkpoint was written; 'fedsys run' starts it again.")
        print(f"error: the run stopped: {exc}\n  {advice}", file=sys.stderr)
        return 1
    table(load_runs(cfg.run_dir), f"{cfg.name} ({time.time() - t0:.0f} s)")
    print(f"results: {cfg.run_dir}/results.md, curves: {cfg.run_dir}/accuracy.png")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """``fedsys resume``: continue a run from its checkpoints."""
    run_dir = Path(args.run_dir).resolve()
    if not (run_dir / "config.yaml").exists():
        raise cfgmod.ConfigError(f"{run_dir} is not a fedsys run directory (no config.yaml)")
    cfgmod.verify_saved(run_dir / "config.yaml")
    cfg = config_schema.load(run_dir / "config.yaml", [*(args.set or []), "resume=true",
                                          f"name={run_dir.name}", f"output-dir={run_dir.parent}"])
    return cmd_run(args, cfg)


def cmd_compare(args: argparse.Namespace) -> int:
    """``fedsys compare``: one table and one plot over run directories (runs over seeds:
    mean ± std across seeds)."""
    from fedsys_launch.commands.results import load_seeded, seeds_table

    seeded: dict[str, dict[int, list[dict[str, Any]]]] = {}
    missing, empty = [], []
    for d in args.run_dirs:
        p = Path(d)
        if not p.is_dir():
            missing.append(d)
            continue
        found = load_seeded(p, prefix=f"{p.name}/" if len(args.run_dirs) > 1 else "")
        if not found:
            empty.append(d)
        seeded.update(found)
    problems = []  # a mistyped directory is not left out of the table without a word
    if missing:
        problems.append(f"no such run directory: {', '.join(missing)}")
    if empty:
        problems.append(f"no metrics (<strategy>/metrics.jsonl) in: {', '.join(empty)}")
    if problems:
        raise cfgmod.ConfigError("; ".join(problems))
    out = Path(args.out)
    if all(len(per_seed) == 1 for per_seed in seeded.values()):
        runs = {name: next(iter(per_seed.values())) for name, per_seed in seeded.items()}
        table(runs, "comparison")
        metrics.plot_curves(runs, out, "comparison")
    else:
        seeds_table(seeded, "comparison across seeds")
        metrics.plot_seed_curves(seeded, out, "comparison")
    print(f"curves: {out}")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """``fedsys partition``: the per-client class histogram and the spread of client sizes."""
    from rich.console import Console
    from rich.table import Table

    from fedsys.domains import domain_of, plot_samples
    from fedsys.partition import class_histogram, plot_histogram, size_spread
    from fedsys.task import dataset, partitions

    cfg = config_schema.load(Path(args.config) if args.config else None, args.set or [])
    ds = dataset(cfg)
    parts = partitions(cfg)
    hist = class_histogram(ds.y_train.numpy(), parts, ds.num_classes)
    t = Table(title=f"{cfg.dataset}, {cfg.partition}, {cfg.num_clients} clients, seed {cfg.seed}")
    t.add_column("client")
    for c in range(ds.num_classes):
        t.add_column(str(c), justify="right")
    t.add_column("total", justify="right")
    doms = [domain_of(i, cfg.seed) for i in range(cfg.num_clients)] if cfg.partition == "domain" else []
    if doms:
        t.add_column("domain (input transform)")
    for i, row in enumerate(hist):
        t.add_row(str(i), *[str(int(v)) for v in row], str(int(row.sum())),
                  *([doms[i].label] if doms else []))
    Console(width=max(Console().width, 110)).print(t)
    spread = size_spread(parts)
    print(f"client sizes: min {spread['min']:.0f}, max {spread['max']:.0f}, mean "
          f"{spread['mean']:.1f}, coefficient of variation {spread['cv']:.3f}")
    out = Path(args.out) if args.out else cfg.run_dir / "partition.png"
    plot_histogram(hist, out, f"{cfg.dataset} {cfg.partition} (seed {cfg.seed})")
    print(f"histogram: {out}")
    if doms:
        seen = plot_samples(ds.x_test[:8], doms, out.with_name(out.stem + "-domains.png"))
        print(f"domains (8 test images as each client sees them): {seen}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """``fedsys data fetch``: make a dataset available."""
    from fedsys.data import fetch_fashion_mnist, load_dataset

    if args.dataset == "fashion-mnist":
        where = fetch_fashion_mnist(args.data_dir, allow_apt=not args.no_apt)
        print(f"Fashion-MNIST is available in {where}")
    else:
        ds = load_dataset(args.dataset, args.data_dir)
        print(f"{args.dataset} is available in {ds.source}: {len(ds.y_train)} training and "
              f"{len(ds.y_test)} test images of {'x'.join(map(str, ds.input_shape))} "
              f"(channels x height x width), {ds.num_classes} classes")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """``fedsys keys``: every config key (``--toml``: pyproject's table)."""
    config_schema.import_plugins(args.plugins or "")
    if args.toml:
        print(config_schema.to_toml(), end="")
        return 0
    if args.markdown:
        print(config_schema.describe_markdown())
        return 0
    print(f"  {'key':24} {'default':12} {'allowed':28} meaning")
    print(config_schema.describe())
    return 0


def versions() -> str:
    """``fedsys X (Flower Y, torch Z, Python W)``: the versions a bug report needs (torch's
    with its build, ``+cpu`` or ``+cu130``)."""
    import torch

    from fedsys import __version__
    from fedsys_launch.flower_patches import flower_version

    py = ".".join(map(str, sys.version_info[:3]))
    return f"fedsys {__version__} (Flower {flower_version()}, torch {torch.__version__}, Python {py})"


class _Version(argparse.Action):
    """``--version``: :func:`versions`, computed only when asked (it imports torch)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(versions())
        parser.exit()


def parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    p = argparse.ArgumentParser(
        prog="fedsys",
        description="Federated learning experiments on Flower (1.41-1.42): simulate, compare, "
        "resume, deploy.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version,
                   help="print fedsys's, Flower's and torch's versions and exit")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("config", nargs="?", help="YAML experiment file (configs/*.yaml)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config key (repeatable); see 'fedsys keys'")

    r = sub.add_parser("run", help="run an experiment in simulation",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run every strategy of CONFIG one after another on identical "
                       "partitions and seeds;\nwrite runs/<name>/ and print the results table.\n\n"
                       "Engines (config key 'engine'; flwr run and a deployment ignore it):\n"
                       "  flower     Flower's simulation engine: ClientApps in Ray actors behind an\n"
                       "             in-process SuperLink, clients training in parallel processes.\n"
                       "             The run starts a Ray cluster of its own with the cores it can\n"
                       "             use (at most num-clients x client-num-cpus), or joins the one\n"
                       "             ray-address (or else RAY_ADDRESS) names (e.g. after 'ray start\n"
                       "             --head --num-gpus=8'), whose resources decide how many clients\n"
                       "             train at once.\n"
                       "  inprocess  fedsys's own Grid: every ClientApp called in this process, no\n"
                       "             Ray, no SuperLink; with batch-clients (default auto: where faster)\n"
                       "             a round's sgd/fedprox clients trained together, batched.\n"
                       "             For many small clients (configs/cross-device.yaml): far less cost\n"
                       "             a client.  batch-clients=false gives the flower engine's numbers\n"
                       "             bit for bit; batched, the same to float rounding.  Batched\n"
                       "             clients go to every GPU of this box with device=cuda, or with\n"
                       "             ray-address=HEAD:PORT to Ray workers on an existing cluster\n"
                       "             ('ray start' on each machine): one per GPU, or per node's CPUs.\n\n"
                       "Tracking (config key 'tracking': tensorboard, mlflow, wandb, both or all):\n"
                       "each round's record also in TensorBoard ('tensorboard --logdir runs/NAME'),\n"
                       "MLflow ('mlflow ui --backend-store-uri sqlite:///runs/mlflow.db') or\n"
                       "Weights & Biases offline ('wandb leet runs/wandb'; 'wandb sync' uploads).")
    with_config(r)
    r.add_argument("--seeds", metavar="K,K,...", help="run everything once per seed (e.g. 0,1,2): "
                   "runs/<name>/seed-<k>/ each, one table and figure across seeds")
    r.add_argument("-v", "--verbose", action="store_true", help="Flower debug logging")
    r.set_defaults(fn=cmd_run)

    rs = sub.add_parser("resume", help="continue an interrupted run from its checkpoints")
    rs.add_argument("run_dir", help="a run directory, e.g. runs/default")
    rs.add_argument("--set", action="append", metavar="KEY=VALUE", help="override (e.g. more rounds)")
    rs.add_argument("-v", "--verbose", action="store_true")
    rs.set_defaults(fn=cmd_resume)

    cp = sub.add_parser("compare", help="one table and one plot over several run directories")
    cp.add_argument("run_dirs", nargs="+")
    cp.add_argument("--out", default="compare.png", help="PNG of the overlaid curves")
    cp.set_defaults(fn=cmd_compare)

    pa = sub.add_parser("partition", help="per-client class histogram of a config's partition")
    with_config(pa)
    pa.add_argument("--out", help="PNG path (default: runs/<name>/partition.png)")
    pa.set_defaults(fn=cmd_partition)

    d = sub.add_parser("data", help="dataset tools")
    dsub = d.add_subparsers(dest="data_cmd", required=True, metavar="ACTION")
    f = dsub.add_parser("fetch", help="make a dataset available locally",
                        description="Fashion-MNIST: look in --data-dir (only there when given), else "
                        "in $FEDSYS_DATA and /usr/share/datasets/fashion-mnist; without "
                        "--data-dir, as root, install the Debian package dataset-fashion-mnist; "
                        "else download through torchvision (into --data-dir when given).  "
                        "custom: check a dataset of your own in --data-dir and say what it "
                        "holds (train.npz and test.npz, or train/ and test/ class folders).")
    f.add_argument("dataset", choices=cfgmod.DATASETS)
    f.add_argument("--data-dir", default="", help="data root to search and download into")
    f.add_argument("--no-apt", action="store_true", help="never call apt-get")
    f.set_defaults(fn=cmd_data)

    from fedsys_launch.commands import landscape, pretrain

    landscape.add_parser(sub)
    pretrain.add_parser(sub)

    from fedsys_launch.commands import deploy_cli

    deploy_cli.add_parser(sub)

    k = sub.add_parser("keys", help="list every config key with its default and allowed values")
    k.add_argument("--toml", action="store_true",
                   help="print the defaults as pyproject.toml's [tool.flwr.app.config] tables")
    k.add_argument("--markdown", action="store_true",
                   help="print the table in Markdown (docs/configuration.md holds it)")
    k.add_argument("--plugins", metavar="MODULES",
                   help="also the keys of the methods these modules register (comma-separated)")
    k.set_defaults(fn=cmd_keys)
    return p


def stopped(terminated: bool, cmd: str) -> int:
    """Say what a stop of command ``cmd`` leaves and how to go on; the exit status of
    Ctrl-C (130) or SIGTERM (143)."""
    stop = "terminated (SIGTERM)" if terminated else "interrupted"
    if cmd == "deploy":  # 'flwr run' only streams a run the SuperLink holds
        then = ("a run already submitted goes on in the deployment ('fedsys deploy status' "
                "lists it, 'fedsys deploy down' stops the deployment)")
    elif cmd in ("run", "resume"):
        then = "'fedsys resume <run dir>' continues from the last checkpoint"
    else:
        then = f"'fedsys {cmd}' stopped"
    print(f"{stop}; {then}", file=sys.stderr)
    return 143 if terminated else 130


def set_up_process() -> None:
    """What a ``fedsys`` process sets for itself before any command runs (the console
    script and ``python -m fedsys_launch`` call it through :func:`command`; a program that
    calls :func:`main` keeps its own process as it is).

    Output to a file or a pipe carries no colour codes
    (:func:`fedsys_launch.process.console.plain_when_redirected`).  Idle OpenMP threads wait
    passively (``OMP_WAIT_POLICY``, read when torch loads: set before any import of it;
    spinning threads slowed the in-process engine's rounds: docs/performance.md "The floor
    of a round that sends Flower's messages").  Freed memory is kept for the next round
    (:func:`fedsys_launch.process.heap.keep_freed_memory`).  Ctrl-C and SIGTERM stop a run with its
    checkpoint, also where SIGINT came ignored from the parent
    (:func:`fedsys_launch.process.stopping.install`).  A user's own OpenMP and malloc settings stand;
    numbers do not change.
    """
    from fedsys_launch.process.console import plain_when_redirected

    plain_when_redirected()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    heap.keep_freed_memory(os.environ)
    stopping.install()


def command(argv: Sequence[str] | None = None) -> int:
    """The ``fedsys`` command as a process runs it (``[project.scripts]``, ``python -m
    fedsys_launch``): :func:`set_up_process`, then :func:`main`; a failed command exits
    even where its run left threads behind (:func:`exit_now_if_threads_linger`)."""
    set_up_process()
    rc = main(argv)
    if rc != 0:
        exit_now_if_threads_linger(rc)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fedsys`` command with ``argv`` (default: the command line's) in this
    process as it is; errors in the input exit 2 with one line."""
    args = parser().parse_args(argv)
    from fedsys.data import DataError
    from fedsys.metrics import MetricsFileError
    from fedsys.partition import PartitionError

    try:
        return int(args.fn(args))
    except (cfgmod.ConfigError, DataError, PartitionError, MetricsFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return stopped(isinstance(exc, stopping.Terminated), args.cmd)
    except SystemExit as exc:
        # Ray's own SIGTERM handler, set by ray.init in the simulation, ends the process with
        # sys.exit(SIGTERM) instead of :func:`fedsys_launch.process.stopping.on_signal`
        if exc.code != signal.SIGTERM:
            raise
        return stopped(True, args.cmd)


def exit_now_if_threads_linger(rc: int, grace: float = 10.0) -> None:
    """End the process with ``rc`` when threads of a failed run are still alive after
    ``grace`` seconds.

    When Flower's simulation engine crashes (its Ray cluster lost, say), the ServerApp
    thread waits for replies that never come, and Python would wait for that thread at
    exit: the command would print its error and then hang.  Only :func:`command` does
    this; :func:`main` returns as usual.
    """
    import threading

    main_thread = threading.main_thread()
    others = [t for t in threading.enumerate()
              if t is not main_thread and not t.daemon and t.is_alive()]
    end = time.monotonic() + grace
    for t in others:
        t.join(max(0.0, end - time.monotonic()))
    stuck = [t.name for t in others if t.is_alive()]
    if stuck:
        print(f"fedsys: exiting; {len(stuck)} thread(s) of the stopped run did not end "
              f"({', '.join(stuck)})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(rc)


if __name__ == "__main__":
    sys.exit(command())
