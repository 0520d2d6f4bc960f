"""fedsys_launch/superexec.py: Flower's SuperExec with its app processes forked from a warm
fork server.  The deployments in tests/integration run every app process this way
(deployment equals simulation, resume after a killed ServerApp, killed sites); here the
parts: which modules are imported ahead, what a forked app process looks like, and
Flower's executor routed through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import subprocess_executor
from flwr.supercore.superexec.executor.types import ExecutionSpec

from fedsys_launch import superexec


def test_preload_defaults_empty_and_refusals():
    assert superexec.preload_modules({}) == ["torch", "numpy"]
    assert superexec.preload_modules({superexec.ENV: ""}) == []
    assert superexec.preload_modules({superexec.ENV: " numpy , json "}) == ["numpy", "json"]
    with pytest.raises(SystemExit, match=f"{superexec.ENV}: not_a_module_here is not installed"):
        superexec.preload_modules({superexec.ENV: "numpy,not_a_module_here"})
    for own in ("fedsys_launch.client_app", "fedsys", "numpy,strategies.fedavg"):
        with pytest.raises(SystemExit, match=f"{superexec.ENV}: .*fedsys's own code"):
            superexec.preload_modules({superexec.ENV: own})


def test_own_packages_are_dropped_and_libraries_kept():
    modules = {"fedsys_launch": 1, "fedsys_launch.client_app": 2, "fedsys.task": 3,
               "strategies": 4, "clients.base": 5, "torch": 6, "launch": 7, "fedsysx": 8,
               "fedsys_launcher": 9}
    assert sorted(superexec.drop_own_modules(modules)) == [
        "clients.base", "fedsys.task", "fedsys_launch", "fedsys_launch.client_app", "strategies"]
    assert modules == {"torch": 6, "launch": 7, "fedsysx": 8, "fedsys_launcher": 9}


def test_console_entry_is_the_installed_script():
    from flwr.supernode.cli import flwr_clientapp

    assert superexec.console_entry("flwr-clientapp") is flwr_clientapp
    with pytest.raises(SystemExit, match="no console script 'no-such-command'"):
        superexec.console_entry("no-such-command")


PROBE = """
import os, sys
from multiprocessing import active_children
sys.path.insert(0, {root!r})
from fedsys_launch import superexec
starter = superexec.WarmStarter(["numpy"])
out = {out!r}
# what a fresh fedsys process prints: a console script with its arguments, run in a child
# forked from the fork server, its own modules imported anew
p = starter.Popen(["fedsys", "--help"])
p.join(120)
print("help-exit", p.exitcode, flush=True)
q = starter.Popen(["fedsys", "no-such-action"], stdout=superexec.WarmStarter.DEVNULL,
                  stderr=superexec.WarmStarter.DEVNULL)
q.join(120)
print("bad-exit", q.exitcode, flush=True)
print("left", len(active_children()), flush=True)
"""


def test_a_forked_app_process_runs_the_command_with_its_arguments_and_exit_status(tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    res = subprocess.run([sys.executable, "-c", PROBE.format(root=root, out=str(tmp_path))],
                         capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "usage: fedsys" in res.stdout  # the forked child wrote to the parent's stdout
    assert "help-exit 0" in res.stdout
    assert "bad-exit 2" in res.stdout   # argparse's refusal, its output sent to /dev/null
    assert "invalid choice" not in res.stdout + res.stderr
    assert "left 0" in res.stdout


def test_flowers_executor_launches_through_the_fork_server(monkeypatch):
    """``SubprocessExecutor.launch`` builds Flower's command line and hands it to the
    starter (the forked processes carry it as their title: test_deploy_tls finds the
    killed ``flwr-serverapp`` by it)."""
    seen: list[tuple[list[str], object]] = []

    class Starter:
        def Popen(self, args, stdout=None, stderr=None):  # noqa: N802
            seen.append((list(args), stdout))

    monkeypatch.setattr(superexec, "WarmStarter", lambda preload: Starter())
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    assert superexec.apply({superexec.ENV: "numpy"}) is not None
    spec = ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:9094",
                         token="t0k", insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=42,
                         suppress_output=False, task_id=7)
    subprocess_executor.SubprocessExecutor().launch(spec)
    assert seen == [(["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token",
                      "t0k", "--insecure", "--parent-pid", "42"], None)]
    # nothing to import ahead: Flower's own subprocess.Popen stays
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    assert superexec.apply({superexec.ENV: ""}) is None
    assert subprocess_executor.subprocess is subprocess


def test_it_is_flowers_superexec_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "fedsys_launch.superexec", "--help"],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**__import__("os").environ, superexec.ENV: ""}).stdout
    assert out.startswith("usage: flower-superexec") and "--runtime-api-address" in out
