"""The fedsys command line: help, clear errors, partition and compare (no simulation)."""

from __future__ import annotations

import contextlib
import json

import pytest

from fedsys import config as cfgmod
from fedsys_launch.commands.cli import main


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("run", "resume", "compare", "partition", "data", "keys"):
        assert cmd in out


def test_version_names_fedsys_flower_and_torch(capsys):
    from importlib import metadata

    import flwr
    import torch

    import fedsys

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"fedsys {fedsys.__version__} (")
    assert f"Flower {flwr.__version__}" in out and f"torch {torch.__version__}" in out
    assert metadata.version("fedsys") == fedsys.__version__  # pyproject's and the package's


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--set", "num-clinets=3"], "Did you mean 'num-clients'"),
        (["run", "--set", "lr=abc"], "config key 'lr' expects float"),
        (["run", "--set", "strategy=fedavg,nope"], "allowed values: fedavg, fedprox"),
        (["run", "missing.yaml"], "config file not found"),
        (["resume", "/nonexistent/run"], "not a fedsys run directory"),
        (["run", "--set", "dataset=synthetic", "--set", "partition=dirichlet",
          "--set", "num-clients=20", "--set", "dirichlet-min-size=500"], "dirichlet-min-size=500"),
        (["run", "--set", "dataset=synthetic", "--set", "num-clients=30",
          "--set", "strategy=fedavg,fedcda[fedcda.selection=optimal]"], "lower 'num-clients'"),
        (["run", "--set", "strategy=fedcda[seed=4]"], "may not change 'seed'"),
        (["run", "--set", "strategy=fedcda[fedcda.memory=0]"], "'fedcda.memory' must be > 0"),
        (["run", "--set", "seed=-1"], "config key 'seed' must be in [0, 4294967295], got -1"),
        (["run", "--set", "seed=4294967296"], "'seed' must be in [0, 4294967295]"),
        (["run", "--set", "seeds=0,-1"], "give distinct integers in [0, 4294967295]"),
        (["run", "--set", "name=../../tmp/x"], "'name' must be one directory name"),
        (["run", "--set", "name=.."], "'name' must be one directory name"),
        (["run", "--set", "strategy=fedcda[fedcda.warmup=3;fedcda.warmup=4]"],
         "sets 'fedcda.warmup' twice"),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_code_2(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err
    assert "Traceback" not in err


def test_missing_dataset_message_says_how_to_get_it(capsys, tmp_path, monkeypatch):
    import fedsys.data as data

    monkeypatch.setattr(data, "DEBIAN_FMNIST", tmp_path / "none")
    monkeypatch.setenv("FEDSYS_DATA", str(tmp_path))
    data.load_dataset.cache_clear()
    assert main(["run", "--set", f"data-dir={tmp_path}"]) == 2
    data.load_dataset.cache_clear()
    err = capsys.readouterr().err
    assert "fedsys data fetch fashion-mnist" in err and "dataset-fashion-mnist" in err


def test_keys_lists_every_option(capsys):
    from fedsys_launch.config_schema import schema

    options = schema().options

    assert main(["keys"]) == 0
    out = capsys.readouterr().out
    assert all(o.key in out for o in options)


def test_partition_prints_histogram_and_writes_png(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["partition", "--set", "dataset=synthetic", "--set", "num-clients=4",
                 "--set", "clients-per-round=2", "--set", "partition=shards",
                 "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "total" in out and png.read_bytes()[:4] == b"\x89PNG"
    assert "client sizes: min" in out and "coefficient of variation" in out


def test_partition_prints_the_size_spread_of_the_balanced_dirichlet_split(tmp_path, capsys):
    assert main(["partition", "--set", "dataset=synthetic", "--set", "num-clients=5",
                 "--set", "clients-per-round=2", "--set", "partition=dirichlet-balanced",
                 "--out", str(tmp_path / "p.png")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("client sizes"))
    cv = float(line.rsplit(" ", 1)[-1])
    assert 0 <= cv < 0.5, line


def test_partition_of_the_capped_dirichlet_split_keeps_the_minimum_size(tmp_path, capsys):
    assert main(["partition", "--set", "dataset=synthetic", "--set", "num-clients=5",
                 "--set", "clients-per-round=2", "--set", "partition=dirichlet-capped",
                 "--set", "dirichlet-alpha=0.1", "--set", "dirichlet-min-size=40",
                 "--out", str(tmp_path / "p.png")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("client sizes"))
    assert int(line.split("min ")[1].split(",")[0]) >= 40, line


def test_compare_reads_run_dirs(tmp_path, capsys):
    for run, acc in (("a", 0.5), ("b", 0.7)):
        d = tmp_path / run / "fedavg"
        d.mkdir(parents=True)
        (tmp_path / run / "config.yaml").write_text("strategy: fedavg\n")
        (d / "metrics.jsonl").write_text(
            "\n".join(json.dumps({"round": r, "accuracy": acc}) for r in (0, 1, 2)) + "\n")
    out_png = tmp_path / "c.png"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "a/fedavg" in out and "b/fedavg" in out and "70.00" in out
    assert out_png.exists()


def test_compare_names_a_missing_or_empty_run_dir_instead_of_leaving_it_out(tmp_path, capsys):
    good = tmp_path / "a" / "fedavg"
    good.mkdir(parents=True)
    (good / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5}) + "\n")
    (tmp_path / "empty").mkdir()
    args = ["compare", str(tmp_path / "a"), str(tmp_path / "typo"), str(tmp_path / "empty"),
            "--out", str(tmp_path / "c.png")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert f"no such run directory: {tmp_path / 'typo'}" in err
    assert f"no metrics (<strategy>/metrics.jsonl) in: {tmp_path / 'empty'}" in err
    assert str(tmp_path / "a") + "," not in err and not (tmp_path / "c.png").exists()


def test_asking_for_a_gpu_without_cuda_is_a_config_error(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine
    assert main(["run", "--set", "dataset=synthetic", "--set", "client-num-gpus=0.5"]) == 2
    assert "'client-num-gpus' asks for a GPU" in capsys.readouterr().err


def test_a_run_without_any_usable_update_exits_1_with_one_line(monkeypatch, capsys, tmp_path):
    from fedsys_launch.engines import simulation
    from strategies.base import NoUsableUpdateError

    def no_updates(cfg, verbose=False, client_app=None):
        raise NoUsableUpdateError("[fedcda] no round produced a usable update: every reply "
                                  "was refused or missing")

    monkeypatch.setattr(simulation, "simulate", no_updates)
    code = main(["run", "--set", "dataset=synthetic", "--set", "num-clients=3",
                 "--set", "clients-per-round=2", "--set", f"output-dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "no round produced a usable update" in err[0]


def test_a_plugin_that_cannot_be_imported_is_named(capsys):
    assert main(["run", "--set", "plugins=no_such_module_xyz"]) == 2
    assert "config key 'plugins': cannot import 'no_such_module_xyz'" in capsys.readouterr().err


def test_the_simulation_env_reaches_rays_own_config():
    """``fedsys run`` sets Ray's health-check threshold through the environment: a misspelt
    name would be ignored without a word, and a starved run would lose its cluster again."""
    import os
    import subprocess
    import sys

    from fedsys_launch.process.flower_env import FLWR_ENV

    env = {**os.environ, **FLWR_ENV}
    out = subprocess.run(
        [sys.executable, "-c",
         "import ray._raylet as r; print(r.Config.health_check_failure_threshold())"],
        env=env, capture_output=True, text=True, check=True).stdout
    assert int(out.split()[-1]) == int(FLWR_ENV["RAY_health_check_failure_threshold"]) > 5


def test_every_ray_setting_in_the_simulation_env_is_a_name_ray_reads():
    """Ray reads ``RAY_<name>`` for each of its config names and ignores other names
    silently; its raylet binary holds every name it reads."""
    from pathlib import Path

    import ray

    from fedsys_launch.process.flower_env import FLWR_ENV

    raylet = (Path(ray.__file__).parent / "core/src/ray/raylet/raylet").read_bytes()
    names = [k for k in FLWR_ENV if k.startswith("RAY_") and k[4:5].islower()]
    assert "RAY_gcs_rpc_server_reconnect_timeout_s" in names
    for name in names:
        assert name.encode() + b"\0" in raylet, name
    assert b"RAY_gcs_rpc_server_reconect_timeout_s\0" not in raylet  # the check can fail


def test_a_simulation_joins_the_cluster_ray_address_names_or_starts_its_own():
    """With ``RAY_ADDRESS`` the run joins that cluster without sizing it (``ray.init``
    refuses ``num_cpus`` there); without, it starts a private one with every core it can use
    and never joins a cluster that ``ray start`` recorded under /tmp/ray."""
    import os

    import ray

    from fedsys_launch.engines.simulation import ray_init_args

    own = ray_init_args({})
    assert own == {"address": "local", "num_cpus": os.cpu_count() or 1,
                   "include_dashboard": False}
    assert ray_init_args({"RAY_ADDRESS": "  "}) == own  # empty means unset, as for Ray
    assert ray_init_args({"RAY_ADDRESS": "local"}) == own  # Ray's own word for a new one
    joined = ray_init_args({"RAY_ADDRESS": "127.0.0.1:6379"})
    assert joined == {"address": "127.0.0.1:6379", "include_dashboard": False}
    # a private cluster is no larger than the run can use (Flower starts an actor per CPU)
    assert ray_init_args({}, cpus_needed=1)["num_cpus"] == 1
    assert ray_init_args({}, cpus_needed=0.5)["num_cpus"] == 1  # rounded up
    assert ray_init_args({}, cpus_needed=10_000) == own
    assert ray_init_args({"RAY_ADDRESS": "127.0.0.1:6379"}, cpus_needed=1) == joined
    # Ray's own rule, which the joined form must respect
    with pytest.raises(ValueError, match="num_cpus and num_gpus must not be provided"):
        ray.init(**{**joined, "num_cpus": 2})
    assert not ray.is_initialized()


@pytest.mark.parametrize(("address", "says"), [
    ("127.0.0.1:1", "RAY_ADDRESS=127.0.0.1:1: no Ray cluster answers there"),
    ("ray://127.0.0.1:1", "RAY_ADDRESS=ray://127.0.0.1:1: no Ray cluster answers there"),
    ("nonsense", "RAY_ADDRESS='nonsense' is not host:port"),
    ("127.0.0.1:", "is not host:port"),
])
def test_a_ray_address_where_no_cluster_answers_stops_the_run_before_ray(
        monkeypatch, capsys, address, says):
    """Ray itself would retry a dead ``RAY_ADDRESS`` for ever, printing only warnings."""
    monkeypatch.setenv("RAY_ADDRESS", address)
    args = ["run", "--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=3",
            "--set", "clients-per-round=3", "--set", "num-server-rounds=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: environment variable ") and says in err, err


@pytest.mark.parametrize("engine", ["flower", "inprocess"])
def test_a_configured_ray_address_wins_and_a_dead_one_stops_either_engine(monkeypatch, capsys,
                                                                          engine):
    """Config key ``ray-address`` names the cluster for both engines (the in-process one
    sends its batched clients there), over ``RAY_ADDRESS``; a dead one is refused before
    any engine starts, naming the key."""
    from fedsys_launch.engines.simulation import ray_address, ray_init_args

    env = {"RAY_ADDRESS": "127.0.0.1:6379"}
    assert ray_address(env) == ("127.0.0.1:6379", "RAY_ADDRESS")
    assert ray_address(env, " 10.0.0.2:6379 ") == ("10.0.0.2:6379", "ray-address")
    assert ray_address({}) == ("", "")
    assert ray_init_args(env, 3, "10.0.0.2:6379") == {"address": "10.0.0.2:6379",
                                                       "include_dashboard": False}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = ["run", "--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=3",
            "--set", "clients-per-round=3", "--set", "num-server-rounds=1",
            "--set", f"engine={engine}", "--set", "ray-address=127.0.0.1:1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config key ray-address=127.0.0.1:1: no Ray cluster answers "
                          "there"), err


def test_a_ray_address_the_in_process_engine_cannot_use_is_said(tmp_path, caplog):
    """One client at a time never goes to the cluster: the run goes on here and says why."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as srv:  # something answers there
        address = f"127.0.0.1:{srv.getsockname()[1]}"
        assert main(["run", "--set", "dataset=synthetic", "--set", "model=mlp",
                     "--set", "num-clients=3", "--set", "clients-per-round=3",
                     "--set", "num-server-rounds=1", "--set", "strategy=fedavg",
                     "--set", "engine=inprocess", "--set", "batch-clients=false",
                     "--set", f"ray-address={address}", "--set", f"output-dir={tmp_path}"]) == 0
    assert (f"ray-address {address} is not used: on the in-process engine only clients trained "
            "together go to the cluster, and here none are (batch-clients is false)") in caplog.text


def test_a_ray_address_that_answers_or_leaves_the_choice_to_ray_is_accepted():
    import socket

    from fedsys_launch.engines.simulation import ray_address_problem

    with socket.create_server(("127.0.0.1", 0)) as srv:  # something listens there
        port = srv.getsockname()[1]
        assert ray_address_problem({"RAY_ADDRESS": f"127.0.0.1:{port}"}) is None
        assert ray_address_problem({"RAY_ADDRESS": f"ray://127.0.0.1:{port}"}) is None
    for unset in ({}, {"RAY_ADDRESS": ""}, {"RAY_ADDRESS": "local"}, {"RAY_ADDRESS": "auto"}):
        assert ray_address_problem(unset) is None


def test_a_failed_command_does_not_wait_for_threads_its_run_left_behind():
    """After an engine crash the ServerApp thread can wait for ever; the command exits with
    its status and names the thread instead of hanging."""
    import subprocess
    import sys
    import time

    code = ("import threading, time\n"
            "from fedsys_launch.commands.cli import exit_now_if_threads_linger\n"
            "threading.Thread(target=time.sleep, args=(600,), name='serverapp').start()\n"
            "exit_now_if_threads_linger(1, grace=0.5)\n"
            "print('not reached')\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 1 and time.monotonic() - t0 < 60
    assert "1 thread(s) of the stopped run did not end (serverapp)" in proc.stderr
    assert "not reached" not in proc.stdout
    # a thread that ends within the grace period is waited for, and the caller goes on
    code_ok = code.replace("args=(600,)", "args=(0.1,)")
    proc = subprocess.run([sys.executable, "-c", code_ok], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and "not reached" in proc.stdout and proc.stderr == ""


def test_the_simulations_app_config_reads_back_as_the_run_config_in_flower(tmp_path):
    """``fedsys_launch.engines.simulation.write_app_dir``: Flower's own loader gets every value back,
    quotes, backslashes and dotted keys included."""
    from flwr.common.config import get_fused_config_from_dir, get_project_config

    from fedsys_launch.config_schema import build
    from fedsys_launch.engines.simulation import write_app_dir

    cfg = build({"name": 'a "quoted" \\ name', "about": "line\nbreak", "fedcda.warmup": 2,
                 "strategy": "fedavg,fedcda[fedcda.memory=2]", "lr": 0.05, "resume": True})
    write_app_dir(cfg, tmp_path)
    assert get_fused_config_from_dir(tmp_path, {}) == cfg.to_dict()
    app = get_project_config(tmp_path)["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedsys_launch.apps.server_app:app",
                                 "clientapp": "fedsys_launch.apps.client_app:app"}


@pytest.mark.parametrize(("terminated", "cmd", "rc", "needle"), [
    (False, "run", 130, "interrupted; 'fedsys resume <run dir>' continues"),
    (True, "resume", 143, "terminated (SIGTERM); 'fedsys resume <run dir>' continues"),
    (True, "deploy", 143, "a run already submitted goes on in the deployment"),
    (False, "pretrain", 130, "interrupted; 'fedsys pretrain' stopped"),
])
def test_a_stop_says_what_it_leaves_per_command(terminated, cmd, rc, needle, capsys):
    from fedsys_launch.commands.cli import stopped

    assert stopped(terminated, cmd) == rc
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert ("fedsys resume" in err) == (cmd in ("run", "resume"))


@contextlib.contextmanager
def held_elsewhere(run_dir):
    """``run_dir`` held by another process (a second ``fedsys``) for a ``with`` block."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from fedsys_launch.process.run_lock import holding\n"
            "with holding(Path(sys.argv[1])):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc.pid
    finally:
        proc.communicate("", timeout=60)  # stdin closed: it lets go and ends
    assert proc.returncode == 0


def test_a_run_directory_in_use_is_refused_naming_who_runs_it(tmp_path, capsys):
    """Two ``fedsys run``/``resume`` of one directory at once would write the same
    checkpoints and records: the second is refused before any engine starts, naming the
    process that runs it, and the directory is free again once that process ends."""
    import os

    from fedsys_launch.process.run_lock import RUN_LOCK, holding, in_use

    args = ["run", "--set", "dataset=synthetic", "--set", "num-clients=2",
            "--set", "clients-per-round=2", "--set", f"output-dir={tmp_path}",
            "--set", "name=busy"]
    busy = tmp_path / "busy"
    assert in_use(busy) is None
    with held_elsewhere(busy) as pid:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {busy} is being run by fedsys pid {pid} (since "), err
        assert "--set name=" in err and err.count("\n") == 1
        with pytest.raises(cfgmod.ConfigError, match="is being run by"):  # a resume as well
            with holding(busy):
                pass
        assert in_use(busy).startswith(f"fedsys pid {pid}")
        assert not (busy / "config.yaml").exists()  # the refused run wrote nothing
    assert in_use(busy) is None  # released with its process
    with holding(busy):
        assert (busy / RUN_LOCK).read_text().startswith(f"fedsys pid {os.getpid()}")
        with holding(busy):  # this process again (the CLI around its own ServerApp): runs on
            pass
        assert in_use(busy) is None  # nobody else runs it
    with held_elsewhere(busy):  # and both withs let go
        pass


def test_a_look_at_a_run_directory_does_not_refuse_a_run_starting_then(tmp_path):
    """``in_use`` (``fedsys deploy run``'s check) and ``reproduce.py --list`` hold the lock
    shared for an instant: a run starting in that instant waits it out instead of being
    refused as if somebody ran the directory."""
    import fcntl
    import threading

    from fedsys_launch.process.run_lock import PEEK_WAIT_S, RUN_LOCK, holding

    run_dir = tmp_path / "looked-at"
    run_dir.mkdir()
    (run_dir / RUN_LOCK).write_text("")
    with (run_dir / RUN_LOCK).open("r") as look:
        fcntl.flock(look, fcntl.LOCK_SH | fcntl.LOCK_NB)  # somebody looking
        done = threading.Timer(PEEK_WAIT_S / 5, fcntl.flock, (look, fcntl.LOCK_UN))
        done.start()
        with holding(run_dir):
            assert (run_dir / RUN_LOCK).read_text().startswith("fedsys pid ")
        done.join()


def test_a_servers_run_of_a_directory_in_use_is_refused(tmp_path, capsys):
    """``flwr run`` and ``fedsys deploy run`` start the ServerApp without ``fedsys run``'s
    lock: it takes the lock itself, so a second submission of a running name is refused
    (by ``fedsys deploy run`` before anything is sent), naming the process, writing nothing."""
    from fedsys_launch.apps.server_app import run_experiment
    from fedsys_launch.config_schema import load

    cfg = load(None, ["dataset=synthetic", f"output-dir={tmp_path}", "name=busy"])
    with held_elsewhere(cfg.run_dir) as pid:
        with pytest.raises(cfgmod.ConfigError, match=rf"is being run by fedsys pid {pid} .*"
                                                     r"--run-config \"name='...'\""):
            run_experiment(None, cfg)  # refused before the grid is touched
        config = tmp_path / "c.yaml"
        config.write_text(f"dataset: synthetic\nmodel: mlp\noutput-dir: {tmp_path}\nname: busy\n")
        assert main(["deploy", "run", str(config), "--dir", str(tmp_path / "none")]) == 2
        err = capsys.readouterr().err  # before it looks for a deployment
        assert err.startswith(f"error: {cfg.run_dir} is being run by fedsys pid {pid}"), err
        assert "'flwr stop RUN_ID'" in err and err.count("\n") == 1, err  # a run left running
        assert not (cfg.run_dir / "config.yaml").exists()
