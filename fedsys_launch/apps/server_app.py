"""The fedsys ServerApp (``[tool.flwr.app.components] serverapp``) and its experiment
runner: strategies one after another, with checkpoints.

The runner builds each strategy from the run config (:func:`fedsys_launch.config_schema.make_strategy`)
and calls its Flower ``start`` with ``num_rounds``, ``timeout`` (``round-timeout``), the
local-training keys as ``train_config`` and the central evaluation as ``evaluate_fn``.
Before anything reads a path or imports a plugin, the run config is admitted under the
operator's policy (:mod:`fedsys.confine`: ``FEDSYS_ROOTS``, ``FEDSYS_PLUGINS``); fedsys's own
simulation admits it under the policy of the run's own config (:func:`make_app`).

Run directory layout (``<output-dir>/<name>/``)::

    config.yaml          resolved config
    metrics.jsonl/.csv   every round of every strategy (column ``strategy``)
    accuracy.png         test-accuracy curves of all strategies
    results.md           comparison table
    <strategy>/metrics.jsonl, metrics.csv, accuracy.png,
               checkpoint.pt (latest, atomic), model.pt (final weights)
"""

from __future__ import annotations

import functools
import os
import time
from datetime import timedelta
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedsys import checkpoint, confine, metrics
from fedsys import protocol as proto
from fedsys.attacks import attackers
from fedsys.config import ConfigError, RunConfig
from fedsys.params import to_torch
from fedsys.seeding import derive_seed
from fedsys.task import (
    dataset,
    evaluate,
    initial_params,
    model,
    partitions,
    pick_device,
    test_sets,
)
from fedsys_launch.apps import strategy_start, tracking
from fedsys_launch.apps.strategy_start import kept_checkpoint
from fedsys_launch.apps.tracking import Tracking, results_artifact
from fedsys_launch.config_schema import from_run_config, make_strategy, train_config
from fedsys_launch.process import stopping
from fedsys_launch.process.run_lock import FLWR_RENAME, holding
from strategies.base import FedsysStrategy, NoUsableUpdateError
from strategies.nodes import Known


def _fmt(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def etas(elapsed: float, done: int, left: int, after: int) -> tuple[float, float]:
    """Seconds left for this strategy and for the whole run, at this strategy's pace.

    ``elapsed`` seconds went into ``done`` rounds of this process; ``left`` rounds of
    this strategy and ``after`` rounds of the run's later strategies remain.
    """
    pace = elapsed / max(done, 1)
    return pace * left, pace * (left + after)


def make_evaluate_fn(cfg: RunConfig) -> Any:
    """Central evaluation of a global model on the server's test split."""
    ds = dataset(cfg)
    sets = test_sets(cfg)
    net = model(cfg, ds)
    device = pick_device(cfg.device)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net.load_state_dict(to_torch(proto.from_record(arrays)))
        out: dict[str, float] = {}
        loss_sum, acc_sum, n = 0.0, 0.0, 0
        for label, x, y in sets:
            loss, acc = evaluate(net, ds, x, y, cfg.eval_batch_size, device)
            if label:
                out[f"accuracy-{label}"] = acc
            loss_sum, acc_sum, n = loss_sum + loss * len(y), acc_sum + acc * len(y), n + len(y)
        # one test set: its numbers; domains: the union of the domains' test sets
        return MetricRecord({"accuracy": acc_sum / n, "loss": loss_sum / n, **out})

    return evaluate_fn


def make_estimator_fn(cfg: RunConfig) -> Any:
    """Per-round estimators of the IMA spec §3.4 (``estimators: true``).

    ``est-max-distance`` / ``est-mean-distance``: L2 distance of the accepted client
    models to the new global model; ``est-heldout-loss``: the example-weighted mean
    cross-entropy of each client model on ``estimators-subset`` training samples of
    the other clients (data it does not hold); ``est-own-loss`` the same on its own
    data.  Subsamples are seeded, so runs are comparable.
    """
    import numpy as np

    from fedsys.landscape import distances

    ds = dataset(cfg)
    parts = partitions(cfg)
    net = model(cfg, ds)
    device = pick_device(cfg.device)
    n_all = len(ds.y_train)

    def fn(server_round: int, updates: list[Any], glob: Any) -> dict[str, float]:
        dmax, dmean = distances([u.params for u in updates], glob)
        held, own, w = 0.0, 0.0, 0
        for u in updates:
            rng = np.random.default_rng(derive_seed(cfg.seed, u.partition_id, 0xE57))
            mask = np.ones(n_all, bool)
            mask[parts[u.partition_id]] = False
            other = rng.choice(np.flatnonzero(mask), size=min(cfg.estimators_subset, int(mask.sum())),
                               replace=False)
            mine = rng.choice(parts[u.partition_id],
                              size=min(cfg.estimators_subset, len(parts[u.partition_id])),
                              replace=False)
            net.load_state_dict(to_torch(u.params))
            io, im = torch.from_numpy(other), torch.from_numpy(np.asarray(mine))
            lo, _ = evaluate(net, ds, ds.x_train[io], ds.y_train[io], cfg.eval_batch_size, device)
            lm, _ = evaluate(net, ds, ds.x_train[im], ds.y_train[im], cfg.eval_batch_size, device)
            held += lo * u.num_examples
            own += lm * u.num_examples
            w += u.num_examples
        return {"est-max-distance": dmax, "est-mean-distance": dmean,
                "est-heldout-loss": held / max(w, 1), "est-own-loss": own / max(w, 1)}

    return fn


@functools.cache
def settle_heap() -> None:
    """Once per process, after a run's first round: collect, then freeze every object
    alive (``gc.freeze``: the libraries, the datasets, what the first round imported and
    cached), so that Python's full collections, which the many small objects of a round's
    messages set off, no longer walk them (they stalled rounds: docs/performance.md "The
    floor of a round that sends Flower's messages").  Nothing is kept alive that would be
    freed: an object is still freed when its last reference goes; only garbage cycles
    among the frozen objects would stay, and the collection just before leaves none."""
    import gc

    gc.collect()
    gc.freeze()


class RoundRecorder:
    """Hook: metrics files, a progress line, and atomic checkpoints each round."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, position: str = "",
                 rounds_after: int = 0) -> None:
        self.cfg, self.out, self.name = cfg, out, name
        #: ``"2/8"``: which of the run's strategies this is, shown in the progress line
        self.tag = f"{name} {position}" if position else name
        #: rounds of the run's later strategies (the progress line's whole-run ETA)
        self.rounds_after = rounds_after
        self.t0 = time.monotonic()
        self.done_at_start = 0

    def __call__(self, strategy: FedsysStrategy, record: dict[str, Any]) -> None:
        rec = {"strategy": self.name, **record}
        metrics.append_jsonl(self.out / "metrics.jsonl", rec)
        rnd, total = int(record["round"]), strategy.num_rounds
        if rnd > 0:
            self.save_models(strategy, rnd)
            elapsed = time.monotonic() - self.t0
            eta, eta_run = etas(elapsed, rnd - self.done_at_start, total - rnd,
                                self.rounds_after)
            run_eta = f" (run {_fmt(eta_run)})" if self.rounds_after else ""
            log(INFO, "[%s] %s | acc %.4f | loss %.4f | clients %d ok, %d rejected"
                " | elapsed %s | ETA %s%s", self.tag, strategy.progress(record),
                record.get("accuracy", float("nan")),
                record.get("loss", float("nan")), int(record.get("clients-ok", 0)),
                int(record.get("clients-rejected", 0)), _fmt(elapsed), _fmt(eta), run_eta)
            if (strategy.checkpoint_each_round or rnd % self.cfg.checkpoint_every == 0
                    or rnd in (total, self.cfg.keep_checkpoint)):
                self.save(strategy)
        else:
            log(INFO, "[%s] round 0 | acc %.4f | loss %.4f", self.tag,
                record.get("accuracy", float("nan")), record.get("loss", float("nan")))
        if rnd > 0:
            settle_heap()
        # a stop whose exception a finaliser swallowed stops here, its round recorded
        stopping.raise_if_stopped()

    def save_models(self, strategy: FedsysStrategy, rnd: int) -> None:
        """Keep this round's global (and client) models for ``fedsys landscape``."""
        if self.cfg.save_models == "none" or rnd < self.cfg.save_models_from:
            return
        d = self.out / "models"
        d.mkdir(exist_ok=True)
        if strategy.params is not None:
            torch.save(to_torch(strategy.params), d / f"global-r{rnd:04d}.pt")
        if self.cfg.save_models == "all":
            for u in strategy.verdict.updates:
                torch.save(to_torch(u.params), d / f"client-r{rnd:04d}-p{u.partition_id:04d}.pt")

    def save(self, strategy: FedsysStrategy) -> None:
        """Write the checkpoint atomically (and the kept one at ``keep-checkpoint``)."""
        payload = {
            "round": strategy.round,
            "strategy": strategy.state_dict(),
            "config": self.cfg.to_dict(),
            "rng": checkpoint.rng_state(),
        }
        checkpoint.save(self.out / "checkpoint.pt", payload)
        if strategy.round == self.cfg.keep_checkpoint:
            checkpoint.save(kept_checkpoint(self.out, strategy.round), payload)
        strategy.checkpoint_written()


def run_strategy(grid: Grid, cfg: RunConfig, name: str, position: str = "",
                 known: Known | None = None, rounds_after: int = 0) -> list[dict[str, Any]]:
    """Run (or resume) one strategy; return its per-round records.

    ``cfg`` holds exactly one strategy (see :meth:`RunConfig.variants`); ``name`` is
    its label and names the results directory; ``position`` (``"2/8"``) says which of
    the run's strategies it is in the progress lines; ``known`` holds the nodes'
    query answers across the run's strategies (:meth:`strategies.nodes.NodeDirectory.share`);
    ``rounds_after`` counts the later strategies' rounds (the whole-run ETA).
    """
    out = cfg.run_dir / name
    out.mkdir(parents=True, exist_ok=True)
    strategy = make_strategy(strategy_start.strategy_config(cfg, out))
    if known is not None:
        strategy.nodes.share(known)
    recorder = RoundRecorder(cfg, out, name, position, rounds_after)
    point = strategy_start.enter(cfg, out, strategy, name)
    if point.note:
        log(WARNING, "[%s] %s", name, point.note)
    if point.kind != "fresh":
        recorder.done_at_start = strategy.round
        log(INFO, "[%s] %s after round %d from %s", name,
            "resuming" if point.kind == "resume" else "branched", strategy.round, point.path)
    trackers = Tracking(cfg, out, name, strategy.round + 1 if point.kind != "fresh" else 0)
    initial = initial_params(cfg)
    if strategy.round < strategy.num_rounds:
        strategy.start(grid, proto.to_record(initial), cfg.num_server_rounds,
                       timeout=cfg.round_timeout,
                       train_config=ConfigRecord({**train_config(cfg, strategy.trainer),
                                                  proto.STATE_SCOPE: name}),
                       evaluate_fn=make_evaluate_fn(cfg), on_round=[recorder, trackers],
                       estimator_fn=make_estimator_fn(cfg) if cfg.estimators else None,
                       label=name)
        if strategy.usable_rounds == 0:
            raise NoUsableUpdateError(
                f"[{name}] no round produced a usable update: every reply was refused or "
                "missing (see the log's 'rejected reply' lines)")
    assert strategy.params is not None
    torch.save(to_torch(strategy.params), out / "model.pt")
    records = metrics.read_jsonl(out / "metrics.jsonl")
    metrics.write_csv(out / "metrics.csv", records)
    metrics.plot_curves({name: records}, out / "accuracy.png", f"{cfg.name}: {name}")
    trackers.finish(out)
    return records


def run_experiment(grid: Grid, cfg: RunConfig, log_table: bool = True
                   ) -> dict[str, list[dict[str, Any]]]:
    """Run every strategy of ``cfg`` on identical partitions and seeds, then compare
    (the table into ``results.md``, and into the log with ``log_table``).  The run
    directory is this process's while it runs (:func:`fedsys_launch.process.run_lock.holding`): a second
    ``flwr run`` of the same name is refused, naming the process that runs it."""
    with holding(cfg.run_dir, FLWR_RENAME):
        return _run_experiment(grid, cfg, log_table)


def _run_experiment(grid: Grid, cfg: RunConfig, log_table: bool
                    ) -> dict[str, list[dict[str, Any]]]:
    tracking.check(cfg)  # flwr run and a deployment come here without fedsys run's checks
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "config.yaml")
    log(INFO, "fedsys run '%s': strategies %s, results in %s", cfg.name, cfg.strategies, run_dir)
    if cfg.get("attack.kind") != "none" and int(cfg.get("attack.clients")):
        who = sorted(attackers(cfg.seed, int(cfg.get("attack.clients")), cfg.num_clients))
        log(WARNING, "robustness experiment: partitions %s attack (attack.kind %s) from round %s",
            who, cfg.get("attack.kind"), cfg.get("attack.start-round"))
    results: dict[str, list[dict[str, Any]]] = {}
    variants = list(cfg.variants())
    known = Known()  # one QUERY per node for all the strategies (deployment: fewer processes)
    for i, (name, vcfg) in enumerate(variants, 1):
        try:
            results[name] = run_strategy(
                grid, vcfg, name, f"{i}/{len(variants)}" if len(variants) > 1 else "", known,
                sum(v.num_server_rounds for _, v in variants[i:]))
        except NoUsableUpdateError:
            raise
        except Exception as exc:
            log(WARNING, "[%s] failed: %s: %s (checkpoint kept; 'fedsys resume %s' continues)",
                name, type(exc).__name__, exc, run_dir)
            raise
    allrecs = [r for recs in results.values() for r in recs]
    metrics.write_jsonl(run_dir / "metrics.jsonl", allrecs)
    metrics.write_csv(run_dir / "metrics.csv", allrecs)
    metrics.plot_curves(results, run_dir / "accuracy.png", cfg.name)
    table = metrics.results_table(results)
    (run_dir / "results.md").write_text(metrics.results_page(cfg.name, cfg.about, table,
                                                             metrics.privacy_notes(results)))
    results_artifact(cfg, run_dir)
    if log_table:
        for line in table.splitlines():
            log(INFO, "%s", line)
    else:
        log(INFO, "fedsys run '%s' finished: results in %s/results.md", cfg.name, run_dir)
    return results


def run_config(context: Context, policy: confine.Policy | None = None) -> RunConfig:
    """The run's config from Flower's ``context``, admitted under ``policy``
    (:mod:`fedsys.confine`; default: the operator's, from this process's environment).

    Raises
    ------
    ConfigError
        A key the policy refuses (named, one line), logged before it fails the run.
    """
    try:
        return confine.admit(context.run_config,
                             policy if policy is not None else confine.policy_from_env(os.environ),
                             from_run_config, confine.PATH_KEYS)
    except ConfigError as exc:
        log(ERROR, "fedsys: run refused: %s", exc)
        raise


def make_app(policy: confine.Policy | None = None, log_table: bool = True) -> ServerApp:
    """A fedsys ServerApp: read the run config (:func:`run_config`, under ``policy``) and
    run the experiment, logging the results table at the end with ``log_table``.

    :data:`app`, the one Flower loads (``fedsys_launch.apps.server_app:app``), admits the run
    config under the operator's policy and logs the table (the only one ``flwr run``
    shows); :func:`fedsys_launch.engines.simulation.simulate` builds one for itself in process,
    under the policy of the run's own config (:func:`fedsys.confine.own_run_policy`), that
    leaves the table to ``fedsys run``.
    """
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_experiment(grid, run_config(context, policy), log_table=log_table)

    return server


app = make_app()
