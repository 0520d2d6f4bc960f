"""A Flower user's own app, unchanged but for its strategy line, under every fedsys strategy.

``flower_template/`` is Flower 1.41's PyTorch app template (Message API) in its shape:
a ClientApp with ``@app.train()`` and ``@app.evaluate()`` only (no query handler, Flower's
metric names ``train_loss``, ``eval_loss``, ``eval_acc``, ``num-examples``, the partition
read from ``context.node_config``), a ServerApp that calls ``strategy.start`` with the
run config's ``lr`` and ``num-server-rounds``, and its task (the 60-minute-blitz CNN, Adam).
The strategy line builds a fedsys strategy as docs/flower-apps.md shows (``fedsys_line.py``).  One
more change, forced by running offline: the template loads CIFAR-10 from the Hugging Face
hub with ``flwr_datasets``; ``task.load_data`` cuts the same IID partitions and 80/20
splits from a small local Fashion-MNIST subset instead (see ``task.py``).  Flower 1.41
does not ship the template (``flwr new`` downloads it from Flower Hub), so the files are
written after it, not copied.

Each strategy runs in Flower's simulation engine (4 nodes, 3 rounds; the FedELMY chain
one hop per node), and IMA over FedCDA once more in a deployment (test_deploy_smoke.py: a
SuperLink and 2 SuperNodes as processes on 127.0.0.1, ``flwr run``, 2 rounds): every reply is used, federated accuracy rises, and
the log holds no ERROR, no traceback and no refused reply.  The same client with
``partition-id`` added to its train metrics (``client_app_pid.py``) gives the same
results in that sense under the strategies that key clients (FedCDA's cache, FedCross's
slots, the chain's order): every reply used, accuracy rising.  (Not bit for bit: node
ids are random in every simulation and the template seeds nothing.)  The robust and DP
wrappers (issue 42) over FedAvg too: the median sees every node's model each round, DP
reports a noise level and a growing epsilon.  The client with the additions of Flower's
tutorial "Communicate custom Messages" (``client_app_tutorial.py``: a ``training_time``
metric, an object in a ConfigRecord) under FedCDA with the tutorial's ``aggregate_train``
override: every reply used and its object read, the metric averaged into the round's
metrics.  The template's ClientApp with a fedsys trainer doing its training
(``client_app_trainer.py``, ``clients.message.local_train`` as docs/flower-apps.md shows): LSS under
Flower's own FedAvg and under FedCDA: every reply used, accuracy rising, the soup's size in
every round.
Each simulation's run config reaches both apps through the app's pyproject.toml, as ``flwr run
--run-config`` gives it (Flower's simulation Python API hands it to the ServerApp only).
About 16 simulations of 10 to 40 s each and one deployment.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from fedsys.config import toml_text
from fedsys_launch.engines.simulation import ray_init_args
from fedsys_launch.process.flower_env import FLWR_ENV

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parent / "flower_template"
NODES = 4
ROUNDS = 3
#: FedAdam's adaptive server step (about lr per coordinate, sign-like at first) needs more
#: rounds from a fresh model than the plain means: 3 rounds gave 0.11 -> 0.19 -> 0.23.  IMA
#: over FedCDA, rising but slower (FedCDA's uniform mean of selected models, then IMA's lr
#: decay): 3 rounds gave 0.20 -> 0.23 -> 0.28 in one CI run (2026-11-28; the template seeds
#: nothing, so runs differ), 5 rounds here
ROUNDS_OF = {"fedadam": 6, "fedcda+ima": 5}
#: local epochs per round: 3; a chain's hop 2, so that its later hops can still rise above its
#: first (one client's 240 training images).  Until 2026-11-29 this never reached the ClientApps
#: (they read the pyproject's 1, see _app_with), so the measurements quoted here and below were
#: made with 1 epoch everywhere; with 3, the other 15 cases passed (2026-11-29).  The chain at 1
#: epoch a hop ended 0.19 -> 0.24 in 1 of 6 runs (the template seeds nothing), 0.49-0.62 in 6
#: more; at 2 epochs a hop its first hop ended 0.18-0.46 and its last 0.62-0.70, rising 0.18
#: or more, in 6 of 6 runs (2026-11-29)
EPOCHS_OF = {"fedelmy": 2}
#: the client lr: the template's 0.01, but 0.001 for the chain, FedELMY's paper's Adam lr
#: (its presets' too): at 0.01 each hop refits one client's 240 images, and the chain's last
#: hop ended below its first in one CI run (0.47, 0.46, 0.54, 0.46); at 0.001 the last hop
#: ended 0.23 to 0.41 above the first in 6 of 6 runs (with and without partition-id; at 0.01
#: 0.18 to 0.35 in 3 runs and that CI run's -0.01; 2026-11-27)
#: The median too: its coordinate-wise median of 4 models trained apart at 0.01 (each weight
#: moved up to 24 Adam steps of about 0.01, several times the init's scale) mixes weights
#: of models that no longer agree; its first round ended at 0.10 to 0.57 in 19 runs
#: (2026-12-06, 12 of them in CI's one-actor setting) and at 0.125, 0.108, 0.0875 over 3
#: rounds in one CI run of 2026-12-06 (a model that stopped learning); at 0.001 its first
#: round ended 0.42 to 0.57 and its third 0.63 to 0.68 in 12 of 12 runs (6 in CI's setting)
LR_OF = {"fedelmy": 0.001, "fedavg+median": 0.001}
#: the share of nodes trained each round: the template's 0.5 (2 of 4), every node for the
#: median, whose median of 2 models would be their mean
FRACTION_OF = {"fedavg+median": 1.0}
WRAPPER = re.compile(r"template round \d+: .*\| (.*)")
LINE = re.compile(r"template round (\d+): clients-ok (\d+), clients-rejected (\d+), "
                  r"eval_acc ([-\d.]+)")

sys.path.insert(0, str(APP))  # the template's flat imports (``from task import Net``)
from fedsys_line import STRATEGIES  # noqa: E402


def _app_with(run_config: dict[str, object], where: Path) -> Path:
    """The template app whose pyproject holds ``run_config``, as ``flwr run --run-config``
    gives it to both apps.  (Flower's simulation Python API hands its run config to the
    ServerApp only: a ClientApp reads the app's pyproject.toml.)"""
    app = where / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    data = tomllib.loads((APP / "pyproject.toml").read_text())
    data["tool"]["flwr"]["app"]["config"].update(run_config)
    (app / "pyproject.toml").write_text(toml_text(data))
    return app


def _simulate(strategy: str, client: str, where: Path) -> None:
    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    os.environ.update({k: os.environ.get(k, v) for k, v in FLWR_ENV.items()})
    run_config = {"num-server-rounds": ROUNDS_OF.get(strategy, ROUNDS),
                  "fraction-train": FRACTION_OF.get(strategy, 0.5),
                  "local-epochs": EPOCHS_OF.get(strategy, 3), "lr": LR_OF.get(strategy, 0.01),
                  "strategy": strategy, "client-trainer": TRAINER_OF.get(strategy, "lss")}
    _run_simulation(
        num_supernodes=NODES, exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app_attr=f"{client}:app", server_app_attr="server_app:app",
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},  # type: ignore[typeddict-item]
                        "init_args": ray_init_args(os.environ, NODES)},
        app_dir=str(_app_with(run_config, where)), is_app=True,
        server_app_context=Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                   run_config=run_config))


def check(log_text: str, strategy: str, nodes: int = NODES, rounds_run: int = ROUNDS,
          client: str = "client_app") -> list[tuple[int, int, int, float]]:
    """The rounds the strategy reported; fails on an ERROR, a traceback or a refusal."""
    for bad in ("ERROR", "Traceback", "rejected reply", "No query function"):
        assert bad not in log_text, f"{strategy}: {bad!r} in the log:\n{log_text[-3000:]}"
    rounds = [(int(r), int(ok), int(rej), float(acc)) for r, ok, rej, acc in LINE.findall(log_text)]
    steps = nodes if strategy == "fedelmy" else rounds_run  # a chain's round is a hop
    assert [r for r, *_ in rounds] == list(range(1, steps + 1)), (strategy, rounds)
    # fraction-train of the nodes, at least min_train_nodes = 2 (Flower's rule); a chain: one
    want = 1 if strategy == "fedelmy" else max(int(nodes * FRACTION_OF.get(strategy, 0.5)), 2)
    assert all(ok == want and rej == 0 for _, ok, rej, _ in rounds), (strategy, rounds)
    accs = [acc for *_, acc in rounds]
    assert accs[-1] > accs[0] and accs[-1] > 0.3, (strategy, accs)  # chance is 0.1
    wrapped = WRAPPER.findall(log_text)
    if strategy == "fedavg+median":  # the median saw every node's model each round
        assert [float(m) for m in re.findall(r"robust-models ([\d.]+)", log_text)] \
            == [float(want)] * steps, wrapped
    if strategy == "fedcda-tutorial":  # every used reply's object read, its metric averaged
        meta = re.findall(r"template metadata: round (\d+), partition (\d+), converged True",
                          log_text)
        assert sorted({int(r) for r, _ in meta}) == list(range(1, steps + 1)), meta
        assert len(meta) == want * steps, meta
        times = [float(t) for t in re.findall(r"training_time ([\d.e+-]+)", log_text)]
        assert len(times) == steps and min(times) > 0, wrapped
    if client == "client_app_trainer":  # LSS trained: its soup of 2 and the anchor, every round
        assert [float(v) for v in re.findall(r"soup-size ([\d.]+)", log_text)] \
            == [3.0] * steps, wrapped
    if strategy == "fedavg+dp":  # noised, and the privacy spent grows round by round
        eps = [float(e) for e in re.findall(r"dp-epsilon ([\d.e+]+)", log_text)]
        assert len(eps) == steps and 0 < eps[0] < eps[-1], wrapped
        stds = [float(s) for s in re.findall(r"dp-noise-std ([\d.e+-]+)", log_text)]
        assert len(stds) == steps and min(stds) > 0, wrapped
    return rounds


#: the template under every strategy; with partition-id under those that key clients by it
#: (FedCDA's cache, here with IMA over it; the chain's order); with the additions of
#: Flower's tutorial "Communicate custom Messages" (an extra metric, an object in a
#: ConfigRecord, read by an ``aggregate_train`` override) under FedCDA
CASES = [*((s, "client_app") for s in STRATEGIES),
         *((s, "client_app_pid") for s in ("fedcda+ima", "fedelmy")),
         ("fedcda-tutorial", "client_app_tutorial"),
         *((s, "client_app_trainer") for s in ("flower-fedavg", "fedcda"))]
#: the run config's ``client-trainer`` for client_app_trainer.py: LSS (``""``: the strategy's
#: choice).  Not a case: the chain with FedELMY's pool trainer in this app (1 epoch a hop on
#: 240 images) ended at 0.28-0.49 in 5 runs and stuck at 0.1042 on every hop in one CI run
#: (2026-11-29), too close to the 0.3 this test asks.  Why: at the default beta = 1 the pool
#: models stay near the received model on this 62k-weight CNN (docs/methods.md, "FedELMY's pool on a
#: small model"; the reply's grad-ratio about 2, a WARNING), so the chain learns from its
#: warm-up epoch only, and one warm-up ended at one class.  At fedelmy.beta 0.1 and 2 epochs a
#: hop the last hop ended 0.55-0.64 but rose only 0.04 above the first in 1 of 6 in-process
#: runs: still too close.  The adapter's FedELMY training is fedsys's ClientApp's to the bit
#: (tests/unit/test_message_trainer.py)
TRAINER_OF: dict[str, str] = {}


@pytest.mark.parametrize(("strategy", "client"), CASES)
def test_flowers_template_trains_under_every_fedsys_strategy(strategy, client, tmp_path,
                                                             monkeypatch, caplog, capfd):
    monkeypatch.chdir(tmp_path)  # the template saves final_model.pt in its working directory
    with caplog.at_level(logging.INFO):
        _simulate(strategy, client, tmp_path)
    out, err = capfd.readouterr()
    check("\n".join(r.getMessage() for r in caplog.records) + out + err, strategy,
          rounds_run=ROUNDS_OF.get(strategy, ROUNDS), client=client)
    assert (tmp_path / "final_model.pt").is_file()
