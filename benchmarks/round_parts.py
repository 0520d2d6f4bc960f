"""Where a batched in-process round's time goes, per part, under each heap setting.

``configs/cross-device.yaml`` (1,000 Fashion-MNIST clients of 60 samples, 100 a round, the
MLP) on the in-process engine, batched, each variant a fresh process started as the
``fedsys`` command starts (``fedsys_launch.commands.cli.command``), one after the other.  A wrapper
times each part of the round (the wrappers add their own small cost to every call); the
table gives milliseconds a round over rounds 2.. and the run's median ``round-time``:

- ``kept``: the heap as the command sets it (``fedsys_launch/process/heap.py``);
- ``default``: glibc's defaults (``GLIBC_TUNABLES=`` set, so the command leaves the heap alone);
- ``trim-only`` / ``mmap-only``: one of the two thresholds, set by the environment.

Usage::

    python benchmarks/round_parts.py --rounds 21 --repeat 2
    python benchmarks/round_parts.py --only kept --set model=fmnist-cnn --set samples-per-client=2

(``--set``: more of the run's settings, e.g. the FMNIST CNN on two-sample clients: what a
round costs beside the training for a 582,026-weight model, the part a GPU does not speed up.)
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "kept": {},
    "default": {"GLIBC_TUNABLES": ""},
    "trim-only": {"MALLOC_TRIM_THRESHOLD_": "268435456"},
    "mmap-only": {"MALLOC_MMAP_THRESHOLD_": "33554432"},
}
#: the parts timed: (module, owner or None, attribute)
PARTS = [
    ("strategies.rounds", "RoundEngine", "configure_train"),
    ("fedsys_launch.engines.inprocess", "InProcessGrid", "deliver_batched"),
    ("fedsys_launch.engines.batch_training", "BatchTraining", "prepare"),
    ("fedsys_launch.engines.batch_training", "BatchTraining", "train"),
    ("fedsys_launch.engines.batch_training", "BatchTraining", "reply"),
    ("fedsys_launch.engines.inprocess", None, "copy_message"),
    ("strategies.rounds", "RoundEngine", "validate"),
    ("strategies.fedavg", "FedAvgStrategy", "aggregate"),
]


def child(rounds: int, out: str, sets: list[str]) -> None:
    """One run with every part wrapped; its timings as JSON on the last line."""
    import importlib

    spent: dict[str, float] = collections.defaultdict(float)

    def wrap(owner: Any, name: str, label: str, static: bool) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t

        setattr(owner, name, staticmethod(timed) if static else timed)

    for mod, cls, attr in PARTS:
        m = importlib.import_module(mod)
        owner = getattr(m, cls) if cls else m
        static = cls is not None and isinstance(vars(owner).get(attr), staticmethod)
        wrap(owner, attr, f"{cls + '.' if cls else ''}{attr}", static)
    from fedsys_launch.apps import server_app

    record = server_app.RoundRecorder.__call__

    def recorded(self: Any, strategy: Any, rec: dict[str, Any]) -> None:
        record(self, strategy, rec)
        if int(rec["round"]) == 1:  # the first round pays imports and warm-up: left out
            spent.clear()

    server_app.RoundRecorder.__call__ = recorded  # type: ignore[method-assign,assignment]
    from fedsys_launch.commands.cli import command

    # as the command: the process's heap and OpenMP waiting set, then sys.argv's command
    sys.argv = ["fedsys", "run", str(ROOT / "configs" / "cross-device.yaml"),
                f"--set=num-server-rounds={rounds}", "--set=engine=inprocess",
                "--set=batch-clients=true", *(f"--set={kv}" for kv in sets),
                f"--set=output-dir={out}", "--set=name=parts"]
    try:
        command()
    except SystemExit as exc:
        if exc.code:
            raise
    recs = [json.loads(x) for x in (Path(out) / "parts" / "fedavg" / "metrics.jsonl")
            .read_text().splitlines() if x.strip()]
    rt = statistics.median(float(r["round-time"]) for r in recs if int(r["round"]) >= 2)
    print(json.dumps({"round-time": rt, **{k: v / (rounds - 1) for k, v in spent.items()}}))


def run_variant(name: str, rounds: int, sets: list[str]) -> dict[str, float]:
    """:func:`child` in a fresh process with the variant's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")
           and k != "GLIBC_TUNABLES"} | VARIANTS[name]
    with tempfile.TemporaryDirectory(prefix="fedsys-parts-") as out:
        proc = subprocess.run([sys.executable, __file__, "--child", str(rounds), out,
                               *(f"--set={kv}" for kv in sets)], env=env,
                              capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Run the variants, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--repeat", type=int, default=1, help="passes of all the variants")
    ap.add_argument("--only", default="", help=f"comma-separated of {', '.join(VARIANTS)}")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting of the runs beside the cross-device config's")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], args.set)
        return
    if args.rounds < 3 or args.repeat < 1:
        ap.error("--rounds 3 or more (round 1 is left out), --repeat 1 or more")
    names = [n for n in VARIANTS if not args.only or n in args.only.split(",")]
    got: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for k in range(args.repeat):
        for n in names:
            got[n].append(run_variant(n, args.rounds, args.set))
            print(f"[pass {k + 1}] {n}: {got[n][-1]['round-time']:.3f} s a round", flush=True)
    keys = ["round-time"] + [f"{c + '.' if c else ''}{a}" for _, c, a in PARTS]
    print("\n| ms a round (median of passes) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key in keys:
        cells = [f"{1000 * statistics.median(p.get(key, 0.0) for p in got[n]):.1f}" for n in names]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
