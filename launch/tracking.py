"""Each round's record in TensorBoard and MLflow (config key ``tracking``).

Both trackers read what the ServerApp writes to ``metrics.jsonl``, a round at a time (a
hook of the strategy, beside :class:`launch.server_app.RoundRecorder`), in simulation and
deployment alike, and write it where their own tools read it; nothing goes over a network:

- TensorBoard (``torch.utils.tensorboard``): one event directory per strategy,
  ``<run>/tensorboard/<strategy>/``, every number of a round's record a scalar at step =
  round, the resolved config as text, ``results.md`` as text and the accuracy figure as an
  image at the end.  ``tensorboard --logdir runs/NAME`` shows the strategies side by side (a
  run over seeds: ``runs/NAME/seed-<k>/tensorboard/<strategy>``, every seed's run at once).
  A resumed strategy writes on with ``purge_step`` at its first new round: TensorBoard's
  reader drops what the stopped process wrote from there on, so no step is shown twice.
- MLflow (its local SQLite store, ``<output-dir>/mlflow.db``, artifacts beside it in
  ``<output-dir>/mlartifacts``): one MLflow run per strategy in
  the experiment named after the run (a run over seeds: one experiment for all of its
  seeds, each MLflow run tagged with its seed), the resolved config as parameters, every
  number a metric at step = round, ``results.md``, the figures and the final model as
  artifacts.  ``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`` (or
  ``runs/NAME/mlflow.db`` for seeds; the UI is the full ``mlflow`` package) opens it.  A resumed strategy continues the same MLflow run
  (its id is kept in ``<strategy>/mlflow-run-id``) and skips the rounds that run already
  holds (the resumed rounds are bit-identical to them).

The libraries are the optional extra ``fedsys[tracking]`` (``make test`` installs them); a
run asking for a tracker whose library is missing is refused before it starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedsys.config import ConfigError, RunConfig

#: What config key ``tracking`` may name.
TRACKERS = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"),
            "mlflow": ("mlflow", "mlflow-skinny")}


def wanted(cfg: RunConfig) -> list[str]:
    """The trackers ``cfg`` asks for (``tracking``: ``none``, one, or ``both``)."""
    return {"none": [], "both": ["tensorboard", "mlflow"]}.get(cfg.tracking, [cfg.tracking])


def check(cfg: RunConfig) -> None:
    """Refuse a tracker whose library is not installed, naming the package.

    Raises
    ------
    ConfigError
        ``tracking`` names a tracker that cannot be imported here.
    """
    import importlib

    for name in wanted(cfg):
        module, package = TRACKERS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"config key 'tracking' is {cfg.tracking} but {name} is not "
                              f"installed: pip install 'fedsys[tracking]' (or {package})") from None


def mlflow_store(cfg: RunConfig) -> str:
    """The MLflow tracking URI of ``cfg``'s runs: the SQLite store
    ``<output-dir>/mlflow.db`` (MLflow 3 keeps its file store for old data only)."""
    return f"sqlite:///{Path(cfg.output_dir).resolve() / 'mlflow.db'}"


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a round's record but its step (``round``)."""
    out = {}
    for k, v in record.items():
        if k in ("round", "strategy") or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class TensorBoardTracker:
    """One strategy's event directory; see the module docstring."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, first_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(cfg.run_dir / "tensorboard" / name),
                                    purge_step=first_round if first_round > 0 else None)
        if first_round == 0:
            self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in
                                                     sorted(cfg.to_dict().items())))

    def round(self, record: dict[str, Any]) -> None:
        """Every number of the record at step = round."""
        for k, v in _numbers(record).items():
            self.writer.add_scalar(k, v, int(record["round"]))
        self.writer.flush()

    def finish(self, out: Path) -> None:
        """The accuracy figure, and close."""
        import numpy as np
        from PIL import Image

        figure = out / "accuracy.png"
        if figure.exists():
            with Image.open(figure) as img:
                self.writer.add_image("accuracy-figure", np.asarray(img.convert("RGB")),
                                      dataformats="HWC")
        self.writer.close()


class MlflowTracker:
    """One strategy's MLflow run; see the module docstring."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, first_round: int) -> None:
        import logging

        import mlflow
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        seeded = cfg.name == f"seed-{cfg.seed}"  # a seed of a run over seeds
        self.client = MlflowClient(tracking_uri=mlflow_store(cfg))
        experiment = Path(cfg.output_dir).name if seeded else cfg.name
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=(Path(cfg.output_dir).resolve() / "mlartifacts").as_uri())
        id_file = out / "mlflow-run-id"
        self.done = -1
        if first_round > 0 and id_file.exists():
            self.run_id = id_file.read_text().strip()
            keys = self.client.get_run(self.run_id).data.metrics
            self.done = max((m.step for k in keys for m in self.client.get_metric_history(
                self.run_id, k)), default=-1)
        else:
            run = self.client.create_run(exp_id, run_name=f"{name} seed {cfg.seed}" if seeded
                                         else name,
                                         tags={"fedsys.strategy": name, "fedsys.seed": str(cfg.seed),
                                               "fedsys.run": cfg.name})
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id + "\n")
            params = [mlflow.entities.Param(k[:250], str(v)[:6000])
                      for k, v in sorted(cfg.to_dict().items())]
            for i in range(0, len(params), 100):
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def round(self, record: dict[str, Any]) -> None:
        """Every number of the record at step = round, unless this run holds the round."""
        import time

        from mlflow.entities import Metric

        step = int(record["round"])
        if step <= self.done:
            return
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(k, v, now, step) for k, v in _numbers(record).items()])

    def finish(self, out: Path) -> None:
        """``results.md``'s comparison is the run's; this strategy's figure, metrics and
        final model are its artifacts."""
        for f in ("accuracy.png", "metrics.csv", "model.pt"):
            if (out / f).exists():
                self.client.log_artifact(self.run_id, str(out / f))
        self.client.set_terminated(self.run_id)


class Tracking:
    """The trackers ``cfg`` asks for, for one strategy: a strategy hook (``__call__``)
    and :meth:`finish` once the strategy has written its files."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, first_round: int) -> None:
        kinds: dict[str, type[TensorBoardTracker | MlflowTracker]] = {
            "tensorboard": TensorBoardTracker, "mlflow": MlflowTracker}
        self.trackers = [kinds[k](cfg, out, name, first_round) for k in wanted(cfg)]

    def __call__(self, strategy: object, record: dict[str, Any]) -> None:
        for t in self.trackers:
            t.round(record)

    def finish(self, out: Path) -> None:
        """Each tracker's last words (artifacts, figure) and close."""
        for t in self.trackers:
            t.finish(out)


def results_artifact(cfg: RunConfig, run_dir: Path) -> None:
    """The run's ``results.md`` and figure, into each strategy's MLflow run and as
    TensorBoard text (called once the run's table is written)."""
    if not wanted(cfg):
        return
    page = run_dir / "results.md"
    if not page.exists():
        return
    text = page.read_text()
    if "tensorboard" in wanted(cfg):
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(run_dir / "tensorboard" / "results")) as w:
            w.add_text("results", text)
    if "mlflow" in wanted(cfg):
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_store(cfg))
        for id_file in run_dir.glob("*/mlflow-run-id"):
            run_id = id_file.read_text().strip()
            client.log_artifact(run_id, str(page))
            if (run_dir / "accuracy.png").exists():
                client.log_artifact(run_id, str(run_dir / "accuracy.png"), "run")


__all__ = ["TRACKERS", "MlflowTracker", "TensorBoardTracker", "Tracking", "check",
           "mlflow_store", "results_artifact", "wanted"]
