"""Config key ``tracking`` (fedsys_launch/apps/tracking.py): each round's record in TensorBoard's event
files, MLflow's store and W&B's offline run files, read back with those libraries' own
readers and held against ``metrics.jsonl``; a resumed run continues the same tracker run
without a step twice; nothing is sent beyond the machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedsys import metrics
from fedsys.config import ConfigError
from fedsys_launch.commands.cli import main

SETS = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=3",
        "--set", "clients-per-round=3", "--set", "strategy=fedavg,fedprox",
        "--set", "engine=inprocess", "--set", "tracking=all"]


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


def _wandb(out: Path, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[str]]:
    """W&B's own reader over every offline directory of run ``run_id``: its run records,
    history records and files."""
    from fedsys_launch.apps.tracking import wandb_records

    runs, history, files = [], [], set()
    dirs = sorted((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert dirs, run_id
    for d in dirs:
        for r in wandb_records(d / f"run-{run_id}.wandb"):
            if r["type"] == "run":
                runs.append(r["run"])
            elif r["type"] == "history":
                history.append(r["history"])
            elif r["type"] == "files":
                files |= {f["path"] for f in r["files"]["files"]}
    return runs, history, files


def _check_against_records(out: Path, run_dir: Path, rounds: int) -> None:
    for strategy in ("fedavg", "fedprox"):
        recs = metrics.read_jsonl(run_dir / strategy / "metrics.jsonl")
        assert [r["round"] for r in recs] == list(range(rounds + 1))
        tb = _tensorboard(run_dir / "tensorboard" / strategy)
        wb_runs, wb_history, wb_files = _wandb(
            out, (run_dir / strategy / "wandb-run-id").read_text().strip())
        wb = {h["step"].get("num", 0): h["item"] for h in wb_history}
        assert sorted(wb) == [h["step"].get("num", 0) for h in wb_history]  # once each, in order
        assert sorted(wb) == list(range(rounds + 1)), (strategy, sorted(wb))
        client, run = _mlflow(out, run_dir, strategy)
        for key in ("accuracy", "loss", "train-loss", "clients-ok", "bytes-up"):
            want = [(r["round"], float(r[key])) for r in recs if key in r]
            assert want, key
            assert [s for s, _ in tb[key]] == [s for s, _ in want], (strategy, key)  # once each
            assert [v for _, v in tb[key]] == pytest.approx([v for _, v in want], rel=1e-6)
            hist = sorted((m.step, m.value) for m in client.get_metric_history(  # type: ignore[attr-defined]
                run.info.run_id, key))  # type: ignore[attr-defined]
            assert hist == want, (strategy, key)
            assert [(s, wb[s].get(key)) for s, _ in want] == want, (strategy, key)
        for r in wb_runs:
            assert (r["project"], r["run_group"], r["display_name"]) == ("t", strategy, strategy)
            assert r["config"]["update"]["strategy"] == strategy
            assert sorted(r["tags"]) == [strategy, "seed-0"]
        assert {"model.pt", "accuracy.png", "metrics.csv"} <= wb_files, wb_files
        params = run.data.params  # type: ignore[attr-defined]
        assert params["strategy"] == strategy and params["tracking"] == "all"
        assert run.data.tags["fedsys.strategy"] == strategy  # type: ignore[attr-defined]
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}  # type: ignore[attr-defined]
        assert {"model.pt", "accuracy.png", "metrics.csv", "results.md"} <= arts, arts


def test_a_run_and_its_resume_are_one_tracker_run_each_round_once(tmp_path: Path) -> None:
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
    for s in ("fedavg", "fedprox"):  # W&B writes the resumed part as a second directory
        wb_id = (run_dir / s / "wandb-run-id").read_text().strip()
        assert len(list((out / "wandb").glob(f"offline-run-*-{wb_id}"))) == 2
    results = [d for d in (out / "wandb").glob("offline-run-*") if not any(
        d.name.endswith((run_dir / s / "wandb-run-id").read_text().strip())
        for s in ("fedavg", "fedprox"))]
    assert len(results) == 2  # the run's results page, once per process that wrote it
    for d in results:
        runs, _, files = _wandb(out, d.name.rsplit("-", 1)[1])
        assert runs[0]["run_group"] == "results" and "results.md" in files
    client, run = _mlflow(out, run_dir, "fedavg")
    assert len(client.search_runs([run.info.experiment_id])) == 2  # type: ignore[attr-defined]


def test_a_tracker_that_is_not_installed_is_refused_before_the_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedsys_launch.apps import tracking

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now fails
    assert main(["run", *SETS, "--set", f"output-dir={tmp_path}", "--set", "num-server-rounds=1"]) == 2
    err = capsys.readouterr().err
    assert ("config key 'tracking' is all but mlflow is not installed: pip install "
            "'fedsys[tracking]'") in err
    assert not (tmp_path / "default").exists()
    assert tracking.wanted.__module__ == "fedsys_launch.apps.tracking"
    with pytest.raises(ConfigError):
        tracking.check(type("C", (), {"tracking": "mlflow"})())


def test_a_run_over_seeds_is_one_group_of_tracker_runs(tmp_path: Path) -> None:
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
            wb_id = (out / "grp" / f"seed-{seed}" / strategy / "wandb-run-id").read_text().strip()
            wb_runs, history, _ = _wandb(out / "grp", wb_id)  # every seed in one W&B directory
            assert [(r["project"], r["run_group"], r["display_name"], sorted(r["tags"]))
                    for r in wb_runs] == [("grp", strategy, f"{strategy} seed {seed}",
                                        sorted([strategy, f"seed-{seed}"]))]
            assert [h["step"].get("num", 0) for h in history] == [0, 1, 2]


#: Run in a fresh process whose environment says nothing of CI or of the trackers'
#: switches (MLflow turns its telemetry off by itself in CI): every host name looked up and
#: every connection to an address off this machine is recorded and refused.
_NO_NETWORK = """
import atexit, ipaddress, json, socket, sys
seen = []
atexit.register(lambda: print("OUTSIDE=" + json.dumps(seen)))
def local(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", "")
real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect
def getaddrinfo(host, *a, **k):
    if host is not None and not local(str(host)):
        seen.append(str(host)); raise socket.gaierror("no network in this test")
    return real_getaddrinfo(host, *a, **k)
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not local(str(address[0])):
        seen.append(str(address[0])); raise OSError("no network in this test")
    return real_connect(self, address)
socket.getaddrinfo, socket.socket.connect = getaddrinfo, connect
from fedsys_launch.commands.cli import main
code = main(sys.argv[1:])
import time; time.sleep(3)  # the libraries' background senders start within this
sys.exit(code)
"""


def test_the_trackers_send_nothing_beyond_the_machine(tmp_path: Path) -> None:
    """MLflow 3 sends usage telemetry from its import on and W&B 0.31 probes its server
    from its error reporting, each unless told not to: fedsys tells them (fedsys_launch.apps.tracking.
    offline).  W&B's own process (wandb-core) is started offline with its system-metrics
    sampler off; this test sees the Python side, where both libraries send from."""
    quiet = {"CI", "GITHUB_ACTIONS", "PYTEST_CURRENT_TEST", "MLFLOW_DISABLE_TELEMETRY",
             "DO_NOT_TRACK", "WANDB_ERROR_REPORTING", "WANDB_MODE"}
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    done = subprocess.run([sys.executable, "-c", _NO_NETWORK, "run", *SETS,
                           "--set", f"output-dir={tmp_path}", "--set", "num-server-rounds=1",
                           "--set", "strategy=fedavg"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    outside = [json.loads(line.split("=", 1)[1]) for line in done.stdout.splitlines()
               if line.startswith("OUTSIDE=")]
    assert outside == [[]], outside
