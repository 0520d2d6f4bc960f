"""Config key ``tracking`` (launch/tracking.py): each round's record in TensorBoard's event
files and MLflow's store, read back with those libraries' own readers and held against
``metrics.jsonl``; a resumed run continues the same tracker run without a step twice."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from fedsys import metrics
from fedsys.config import ConfigError
from launch.cli import main

SETS = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=3",
        "--set", "clients-per-round=3", "--set", "strategy=fedavg,fedprox",
        "--set", "engine=inprocess", "--set", "tracking=both"]


def _tensorboard(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of one event directory as (step, value), as TensorBoard shows it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _mlflow(out: Path, run_dir: Path, strategy: str) -> tuple[object, object]:
    """The MLflow client of the store under ``out`` and ``strategy``'s run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out.resolve() / 'mlflow.db'}")
    run_id = (run_dir / strategy / "mlflow-run-id").read_text().strip()
    return client, client.get_run(run_id)


def _check_against_records(out: Path, run_dir: Path, rounds: int) -> None:
    for strategy in ("fedavg", "fedprox"):
        recs = metrics.read_jsonl(run_dir / strategy / "metrics.jsonl")
        assert [r["round"] for r in recs] == list(range(rounds + 1))
        tb = _tensorboard(run_dir / "tensorboard" / strategy)
        client, run = _mlflow(out, run_dir, strategy)
        for key in ("accuracy", "loss", "train-loss", "clients-ok", "bytes-up"):
            want = [(r["round"], float(r[key])) for r in recs if key in r]
            assert want, key
            assert [s for s, _ in tb[key]] == [s for s, _ in want], (strategy, key)  # once each
            assert [v for _, v in tb[key]] == pytest.approx([v for _, v in want], rel=1e-6)
            hist = sorted((m.step, m.value) for m in client.get_metric_history(  # type: ignore[attr-defined]
                run.info.run_id, key))  # type: ignore[attr-defined]
            assert hist == want, (strategy, key)
        params = run.data.params  # type: ignore[attr-defined]
        assert params["strategy"] == strategy and params["tracking"] == "both"
        assert run.data.tags["fedsys.strategy"] == strategy  # type: ignore[attr-defined]
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}  # type: ignore[attr-defined]
        assert {"model.pt", "accuracy.png", "metrics.csv", "results.md"} <= arts, arts


def test_a_run_and_its_resume_are_one_tracker_run_each_round_once(tmp_path):
    out = tmp_path / "runs"
    args = [*SETS, "--set", f"output-dir={out}", "--set", "name=t", "--set", "num-server-rounds=3",
            "--set", "keep-checkpoint=2"]
    assert main(["run", *args]) == 0
    run_dir = out / "t"
    _check_against_records(out, run_dir, 3)
    ids = {s: (run_dir / s / "mlflow-run-id").read_text() for s in ("fedavg", "fedprox")}
    # as a process stopped after round 3 was logged but before its checkpoint was written:
    # the checkpoint goes back to round 2, and resume trains round 3 again
    for s in ("fedavg", "fedprox"):
        shutil.copy(run_dir / s / "checkpoint-r0002.pt", run_dir / s / "checkpoint.pt")
        (run_dir / s / "checkpoint.prev.pt").unlink(missing_ok=True)
    assert main(["resume", str(run_dir), "--set", "num-server-rounds=4"]) == 0
    assert ids == {s: (run_dir / s / "mlflow-run-id").read_text() for s in ("fedavg", "fedprox")}
    _check_against_records(out, run_dir, 4)
    client, run = _mlflow(out, run_dir, "fedavg")
    assert len(client.search_runs([run.info.experiment_id])) == 2  # type: ignore[attr-defined]


def test_a_tracker_that_is_not_installed_is_refused_before_the_run(monkeypatch, tmp_path, capsys):
    from launch import tracking

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now fails
    assert main(["run", *SETS, "--set", f"output-dir={tmp_path}", "--set", "num-server-rounds=1"]) == 2
    err = capsys.readouterr().err
    assert ("config key 'tracking' is both but mlflow is not installed: pip install "
            "'fedsys[tracking]'") in err
    assert not (tmp_path / "default").exists()
    assert tracking.wanted.__module__ == "launch.tracking"
    with pytest.raises(ConfigError):
        tracking.check(type("C", (), {"tracking": "mlflow"})())  # type: ignore[arg-type]


def test_a_run_over_seeds_is_one_group_of_tracker_runs(tmp_path):
    """One MLflow experiment holding every seed's runs, tagged with their seed; a
    TensorBoard directory per seed and strategy under the run."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "runs"
    assert main(["run", *SETS, "--set", f"output-dir={out}", "--set", "name=grp",
                 "--set", "num-server-rounds=2", "--seeds", "0,1"]) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{(out / 'grp').resolve() / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grp")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert sorted((r.data.tags["fedsys.strategy"], r.data.tags["fedsys.seed"]) for r in runs) == [
        ("fedavg", "0"), ("fedavg", "1"), ("fedprox", "0"), ("fedprox", "1")]
    for seed in (0, 1):
        for strategy in ("fedavg", "fedprox"):
            tb = _tensorboard(out / "grp" / f"seed-{seed}" / "tensorboard" / strategy)
            assert [s for s, _ in tb["accuracy"]] == [0, 1, 2]
