"""Server-side experiment runner: strategies one after another, with checkpoints.

Run directory layout (``<output-dir>/<name>/``)::

    config.yaml          resolved config
    metrics.jsonl/.csv   every round of every strategy (column ``strategy``)
    accuracy.png         test-accuracy curves of all strategies
    results.md           comparison table
    <strategy>/metrics.jsonl, metrics.csv, accuracy.png,
               checkpoint.pt (latest, atomic), model.pt (final weights)
"""

from __future__ import annotations

import time
from datetime import timedelta
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsys import checkpoint, flwr_io, metrics
from fedsys.config import RunConfig
from fedsys.params import from_torch, to_torch
from fedsys.task import dataset, evaluate, model, pick_device
from strategies import REGISTRY
from strategies.base import FedsysStrategy


def _fmt(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def make_evaluate_fn(cfg: RunConfig) -> Any:
    """Central evaluation of a global model on the server's test split."""
    ds = dataset(cfg)
    n = cfg.test_subset or len(ds.y_test)
    x, y = ds.x_test[:n], ds.y_test[:n]
    net = model(cfg, ds)
    device = pick_device(cfg.device)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net.load_state_dict(to_torch(flwr_io.from_record(arrays)))
        loss, acc = evaluate(net, ds, x, y, cfg.eval_batch_size, device)
        return MetricRecord({"accuracy": acc, "loss": loss})

    return evaluate_fn


class RoundRecorder:
    """Hook: metrics files, a progress line, and atomic checkpoints each round."""

    def __init__(self, cfg: RunConfig, out: Path, name: str) -> None:
        self.cfg, self.out, self.name = cfg, out, name
        self.t0 = time.monotonic()
        self.done_at_start = 0

    def __call__(self, strategy: FedsysStrategy, record: dict[str, Any]) -> None:
        rec = {"strategy": self.name, **record}
        metrics.append_jsonl(self.out / "metrics.jsonl", rec)
        rnd, total = int(record["round"]), self.cfg.num_server_rounds
        if rnd > 0:
            elapsed = time.monotonic() - self.t0
            done = rnd - self.done_at_start
            eta = elapsed / max(done, 1) * (total - rnd)
            log(INFO, "[%s] round %d/%d | acc %.4f | loss %.4f | clients %d ok, %d rejected"
                " | elapsed %s | ETA %s", self.name, rnd, total, record.get("accuracy", float("nan")),
                record.get("loss", float("nan")), int(record.get("clients-ok", 0)),
                int(record.get("clients-rejected", 0)), _fmt(elapsed), _fmt(eta))
            if rnd % self.cfg.checkpoint_every == 0 or rnd == total:
                self.save(strategy)
        else:
            log(INFO, "[%s] round 0 | acc %.4f | loss %.4f", self.name,
                record.get("accuracy", float("nan")), record.get("loss", float("nan")))

    def save(self, strategy: FedsysStrategy) -> None:
        checkpoint.save(self.out / "checkpoint.pt", {
            "round": strategy.round,
            "strategy": strategy.state_dict(),
            "config": self.cfg.to_dict(),
            "rng": checkpoint.rng_state(),
        })
        strategy.checkpoint_written()


def run_strategy(grid: Grid, cfg: RunConfig, name: str) -> list[dict[str, Any]]:
    """Run (or resume) one strategy; return its per-round records.

    ``cfg`` holds exactly one strategy (see :meth:`RunConfig.variants`); ``name`` is
    its label and names the results directory.
    """
    out = cfg.run_dir / name
    out.mkdir(parents=True, exist_ok=True)
    strategy = REGISTRY[cfg.strategy](cfg)
    strategy.workdir = out
    recorder = RoundRecorder(cfg, out, name)
    ckpt_path = out / "checkpoint.pt"
    if cfg.resume and ckpt_path.exists():
        ckpt = checkpoint.load(ckpt_path)
        strategy.load_state_dict(ckpt["strategy"])
        checkpoint.set_rng_state(ckpt["rng"])
        # Rounds logged after the last checkpoint are redone: drop them.
        kept = [r for r in metrics.read_jsonl(out / "metrics.jsonl") if r["round"] <= strategy.round]
        metrics.write_jsonl(out / "metrics.jsonl", kept)
        recorder.done_at_start = strategy.round
        log(INFO, "[%s] resuming after round %d from %s", name, strategy.round, ckpt_path)
    else:
        (out / "metrics.jsonl").unlink(missing_ok=True)
    strategy.hooks.append(recorder)
    initial = from_torch(model(cfg).state_dict())
    if strategy.round < cfg.num_server_rounds:
        strategy.start(grid, flwr_io.to_record(initial), cfg.num_server_rounds,
                       evaluate_fn=make_evaluate_fn(cfg))
    assert strategy.params is not None
    torch.save(to_torch(strategy.params), out / "model.pt")
    records = metrics.read_jsonl(out / "metrics.jsonl")
    metrics.write_csv(out / "metrics.csv", records)
    metrics.plot_curves({name: records}, out / "accuracy.png", f"{cfg.name}: {name}")
    return records


def run_experiment(grid: Grid, cfg: RunConfig) -> dict[str, list[dict[str, Any]]]:
    """Run every strategy of ``cfg`` on identical partitions and seeds, then compare."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "config.yaml")
    log(INFO, "fedsys run '%s': strategies %s, results in %s", cfg.name, cfg.strategies, run_dir)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, vcfg in cfg.variants():
        try:
            results[name] = run_strategy(grid, vcfg, name)
        except Exception as exc:
            log(WARNING, "[%s] failed: %s: %s (checkpoint kept; 'fedsys resume %s' continues)",
                name, type(exc).__name__, exc, run_dir)
            raise
    allrecs = [r for recs in results.values() for r in recs]
    metrics.write_jsonl(run_dir / "metrics.jsonl", allrecs)
    metrics.write_csv(run_dir / "metrics.csv", allrecs)
    metrics.plot_curves(results, run_dir / "accuracy.png", cfg.name)
    table = metrics.results_table(results)
    (run_dir / "results.md").write_text(f"# {cfg.name}\n\n{table}\n")
    for line in table.splitlines():
        log(INFO, "%s", line)
    return results
