"""Each round's record in TensorBoard, MLflow and Weights & Biases (config key ``tracking``).

The trackers read what the ServerApp writes to ``metrics.jsonl``, a round at a time (a
hook of the strategy, beside :class:`fedsys_launch.apps.server_app.RoundRecorder`), in simulation and
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
- Weights & Biases, in its offline mode only (``wandb``; nothing leaves the machine; the
  system-metrics sampler, which asks cloud metadata addresses, is off): one W&B run per
  strategy in ``<output-dir>/wandb/offline-run-*``, project named after the run (a run
  over seeds: one project for all of its seeds), grouped by strategy so that W&B shows a
  strategy's seeds as one group, tagged with strategy and seed; the resolved config as
  the run's config, every number in its history at step = round, ``accuracy.png``,
  ``metrics.csv`` and ``model.pt`` as run files, and one more run, ``results``, holding
  ``results.md`` and the run's figure.  ``wandb leet runs/wandb`` browses them in the
  terminal; ``wandb sync runs/wandb/offline-run-*`` uploads them to a W&B server of the
  user's choosing.  A resumed strategy continues the same W&B run (its id is kept in
  ``<strategy>/wandb-run-id``; W&B writes a resumed run as one more offline directory
  with that id) and skips the rounds that run's files already hold, read back with W&B's
  own reader (``wandb leet inspect --json``).

The libraries are the optional extras ``fedsys[tracking]`` (TensorBoard, MLflow) and
``fedsys[wandb]`` (``make test`` installs both); a run asking for a tracker whose library
is missing is refused before it starts.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fedsys.config import ConfigError, RunConfig

#: What config key ``tracking`` may name.
TRACKERS = {"tensorboard": ("torch.utils.tensorboard", "tensorboard", "tracking"),
            "mlflow": ("mlflow", "mlflow-skinny", "tracking"),
            "wandb": ("wandb", "wandb", "wandb")}


def wanted(cfg: RunConfig) -> list[str]:
    """The trackers ``cfg`` asks for (``tracking``: ``none``, one, ``both`` for
    TensorBoard and MLflow, or ``all`` three)."""
    return {"none": [], "both": ["tensorboard", "mlflow"],
            "all": ["tensorboard", "mlflow", "wandb"]}.get(cfg.tracking, [cfg.tracking])


def offline() -> None:
    """Turn off what the trackers' libraries would send on their own: MLflow 3's usage
    telemetry (sent from ``import mlflow`` on; its switch ``MLFLOW_DISABLE_TELEMETRY``,
    and an MLflow imported earlier re-reads it) and W&B's error reporting
    (``WANDB_ERROR_REPORTING``; also the W&B reader's subprocess).  Called before any of
    them is imported or started: fedsys's trackers reach nothing beyond this machine."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    if "mlflow" in sys.modules and sys.modules["mlflow"] is not None:
        try:
            from mlflow.telemetry.client import set_telemetry_client
        except ImportError:  # MLflow 2 has no telemetry
            return
        set_telemetry_client()


def check(cfg: RunConfig) -> None:
    """Refuse a tracker whose library is not installed, naming the package.

    Raises
    ------
    ConfigError
        ``tracking`` names a tracker that cannot be imported here.
    """
    import importlib

    if wanted(cfg):
        offline()
    for name in wanted(cfg):
        module, package, extra = TRACKERS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"config key 'tracking' is {cfg.tracking} but {name} is not "
                              f"installed: pip install 'fedsys[{extra}]' (or {package})") from None


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


def wandb_dir(cfg: RunConfig) -> Path:
    """Where W&B writes ``cfg``'s offline runs: ``<output-dir>/wandb`` (W&B adds the
    ``wandb`` itself to the ``dir`` it is given)."""
    return Path(cfg.output_dir).resolve() / "wandb"


def wandb_records(path: Path) -> list[dict[str, Any]]:
    """The records of one offline W&B run file (``run-<id>.wandb``), read by W&B's own
    reader, ``wandb leet inspect --json`` (one JSON object a line).

    Raises
    ------
    RuntimeError
        The reader is missing (wandb older than 0.31) or failed, with its message.
    """
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}  # see offline()
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                           str(path)], capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"'wandb leet inspect --json {path}' failed: "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def wandb_steps(root: Path, run_id: str) -> list[int]:
    """Every history step W&B holds for run ``run_id`` under ``root``, over all of its
    offline directories (a resumed run writes one more), in the order written."""
    steps = []
    for f in sorted(root.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        steps += [int(r["history"].get("step", {}).get("num", 0))
                  for r in wandb_records(f) if r.get("type") == "history"]
    return steps


def _wandb_settings() -> Any:
    """Offline, quiet, no console capture, no system-metrics sampling or machine
    probing (which would ask cloud metadata addresses), no git or code capture; also
    made the process's W&B settings (``wandb.setup``), whose error reporting would
    otherwise probe W&B's server when a run starts (wandb 0.31)."""
    import wandb

    settings = wandb.Settings(mode="offline", silent=True, console="off",
                              x_disable_stats=True, x_disable_machine_info=True,
                              disable_git=True, save_code=False, x_save_requirements=False)
    wandb.setup(settings=settings)
    return settings


def _wandb_files(run: Any, out: Path, names: tuple[str, ...]) -> None:
    """Copy ``names`` (where they exist in ``out``) into the W&B run's files, so that its
    offline directory holds them whatever happens to ``out`` before a sync."""
    for f in names:
        if (out / f).exists():
            shutil.copy(out / f, Path(run.dir) / f)
            run.save(str(Path(run.dir) / f), base_path=run.dir, policy="now")


class WandbTracker:
    """One strategy's offline Weights & Biases run; see the module docstring."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, first_round: int) -> None:
        import wandb

        seeded = cfg.name == f"seed-{cfg.seed}"  # a seed of a run over seeds
        root = wandb_dir(cfg)
        root.mkdir(parents=True, exist_ok=True)
        id_file = out / "wandb-run-id"
        self.done = -1
        if first_round > 0 and id_file.exists():
            run_id = id_file.read_text().strip()
            try:
                self.done = max(wandb_steps(root, run_id), default=-1)
            except RuntimeError as exc:  # log the resumed rounds again rather than none
                logging.getLogger("fedsys").warning(
                    "[%s] W&B run %s: cannot read which rounds it holds (%s); logging from "
                    "round %d", name, run_id, exc, first_round)
                self.done = first_round - 1
        else:
            run_id = uuid.uuid4().hex[:12]  # W&B run ids: letters and digits
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            dir=str(root.parent), project=Path(cfg.output_dir).name if seeded else cfg.name,
            group=name, job_type="strategy", name=f"{name} seed {cfg.seed}" if seeded else name,
            id=run_id, resume="allow", tags=[name, f"seed-{cfg.seed}"],
            config=dict(sorted(cfg.to_dict().items())), settings=_wandb_settings(),
            reinit="create_new")

    def round(self, record: dict[str, Any]) -> None:
        """Every number of the record at step = round, unless this run holds the round."""
        step = int(record["round"])
        if step > self.done:
            self.run.log(_numbers(record), step=step)

    def finish(self, out: Path) -> None:
        """This strategy's figure, metrics and final model as run files, and finish."""
        _wandb_files(self.run, out, ("accuracy.png", "metrics.csv", "model.pt"))
        self.run.finish()


class Tracking:
    """The trackers ``cfg`` asks for, for one strategy: a strategy hook (``__call__``)
    and :meth:`finish` once the strategy has written its files."""

    def __init__(self, cfg: RunConfig, out: Path, name: str, first_round: int) -> None:
        if wanted(cfg):
            offline()
        kinds: dict[str, type[TensorBoardTracker | MlflowTracker | WandbTracker]] = {
            "tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}
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
    offline()
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
    if "wandb" in wanted(cfg):
        import wandb

        seeded = cfg.name == f"seed-{cfg.seed}"
        run = wandb.init(dir=str(wandb_dir(cfg).parent),
                         project=Path(cfg.output_dir).name if seeded else cfg.name,
                         group="results", job_type="results",
                         name=f"results seed {cfg.seed}" if seeded else "results",
                         tags=["results", f"seed-{cfg.seed}"], settings=_wandb_settings(),
                         reinit="create_new")
        _wandb_files(run, run_dir, ("results.md", "accuracy.png", "metrics.csv"))
        run.finish()


__all__ = ["TRACKERS", "MlflowTracker", "TensorBoardTracker", "Tracking", "WandbTracker", "check",
           "mlflow_store", "offline", "results_artifact", "wandb_dir", "wandb_records", "wandb_steps",
           "wanted"]
