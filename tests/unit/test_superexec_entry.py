"""fedsys_launch/deploy/superexec.py: Flower's SuperExec with its app processes started by an
``AppStarter`` (forked from a warm fork server, or spawned), the task token passed in
memory.  The deployments in tests/integration run every app process this way (deployment
equals simulation, resume after a killed ServerApp, killed sites, the red-team tests);
here the parts: which modules are imported ahead, what a forked app process looks like,
its title without the token, its task key, and Flower's executor routed through it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flwr.supercore.auth import derive_auth_secret
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import subprocess_executor
from flwr.supercore.superexec.executor.types import ExecutionSpec

from fedsys_launch import flower_patches
from fedsys_launch.deploy import superexec
from fedsys_launch.runtime_auth import task_key

FLOWER_SUPEREXEC = importlib.import_module("flwr.supercore.cli.flower_superexec")


def test_preload_defaults_empty_and_refusals():
    assert superexec.preload_modules({}) == ["torch", "numpy"]
    assert superexec.preload_modules({superexec.ENV: ""}) == []
    assert superexec.preload_modules({superexec.ENV: " numpy , json "}) == ["numpy", "json"]
    with pytest.raises(SystemExit, match=f"{superexec.ENV}: not_a_module_here is not installed"):
        superexec.preload_modules({superexec.ENV: "numpy,not_a_module_here"})
    for own in ("fedsys_launch.apps.client_app", "fedsys", "numpy,strategies.fedavg"):
        with pytest.raises(SystemExit, match=f"{superexec.ENV}: .*fedsys's own code"):
            superexec.preload_modules({superexec.ENV: own})


def test_own_packages_are_dropped_and_libraries_kept():
    modules = {"fedsys_launch": 1, "fedsys_launch.apps.client_app": 2, "fedsys.task": 3,
               "strategies": 4, "clients.base": 5, "torch": 6, "launch": 7, "fedsysx": 8,
               "fedsys_launcher": 9}
    assert sorted(superexec.drop_own_modules(modules)) == [
        "clients.base", "fedsys.task", "fedsys_launch", "fedsys_launch.apps.client_app", "strategies"]
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
from fedsys_launch.deploy import superexec
starter = superexec.AppStarter(["numpy"])
out = {out!r}
# what a fresh fedsys process prints: a console script with its arguments, run in a child
# forked from the fork server, its own modules imported anew
p = starter.Popen(["fedsys", "--help"])
p.join(120)
print("help-exit", p.exitcode, flush=True)
q = starter.Popen(["fedsys", "no-such-action"], stdout=superexec.AppStarter.DEVNULL,
                  stderr=superexec.AppStarter.DEVNULL)
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


def test_the_token_is_kept_out_of_the_title():
    argv = ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "s3cr3t",
            "--insecure"]
    assert superexec.redacted(argv) == [*argv[:4], "***", "--insecure"]
    assert superexec.token_of(argv) == "s3cr3t"
    assert superexec.token_of(["flwr-clientapp", "--token"]) is None  # no value: none
    assert superexec.redacted(["flwr-clientapp", "--token"]) == ["flwr-clientapp", "--token"]
    assert superexec.token_of(["flwr-clientapp"]) is None


def test_an_app_process_signs_with_its_key_and_shows_no_token(monkeypatch):
    """``run_app`` (what the child runs): the title without the token, the Runtime calls
    signed with the task's key, Flower's command run with the whole argv."""
    titles: list[str] = []
    keys: list[dict[str, bytes]] = []
    ran: list[list[str]] = []
    monkeypatch.setattr(superexec.setproctitle, "setproctitle", titles.append)
    monkeypatch.setattr(flower_patches, "sign_task_calls", keys.append)
    monkeypatch.setattr(superexec, "drop_own_modules", lambda modules: [])  # this process's
    monkeypatch.setattr(superexec, "console_entry",
                        lambda name: lambda: ran.append([name, *sys.argv[1:]]))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    argv = ["/venv/bin/flwr-clientapp", "--token", "s3cr3t", "--insecure"]
    superexec.run_app(argv, quiet=False, key=b"k" * 32)
    assert titles == ["/venv/bin/flwr-clientapp --token *** --insecure"]
    assert keys == [{"s3cr3t": b"k" * 32}]
    assert ran == [["flwr-clientapp", "--token", "s3cr3t", "--insecure"]]
    superexec.run_app(argv, quiet=False, key=None)  # no SuperExec secret: nothing to sign
    assert len(keys) == 1 and len(titles) == 2


def test_popen_hands_the_child_its_arguments_and_task_key_in_memory(monkeypatch):
    """The token goes to the child as a Process argument (through multiprocessing's pipe),
    with the key the Runtime API derives from the SuperExec secret and the token."""
    made: list[dict[str, Any]] = []

    class Context:
        def Process(self, **kwargs: Any) -> Any:  # noqa: N802 (multiprocessing's name)
            made.append(kwargs)
            return type("P", (), {"start": lambda self: None})()

    starter = superexec.AppStarter([])
    assert starter.context.get_start_method() == "spawn"
    starter.context = Context()
    command = ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "t0k"]
    starter.Popen(command, stdout=superexec.AppStarter.DEVNULL)
    starter.auth_secret = derive_auth_secret(b"the SuperExec secret")
    starter.Popen(command)
    first, second = (m["args"] for m in made)
    assert first[0][1:] == command[1:] and first[0][0].endswith("flwr-clientapp")
    assert first[1:] == (True, None)  # quiet; no secret loaded yet: no key
    assert second[1:] == (False, task_key(derive_auth_secret(b"the SuperExec secret"), "t0k"))
    assert all(m["target"] is superexec.run_app for m in made)


def test_flowers_executor_launches_through_the_app_starter(monkeypatch):
    """``SubprocessExecutor.launch`` builds Flower's command line and hands it to the
    starter (the app processes carry it, the token masked, as their title: test_deploy_tls
    finds the killed ``flwr-serverapp`` by it); the SuperExec secret Flower's
    ``flower-superexec`` loads reaches the starter; with nothing to import ahead the app
    processes are spawned, still through the starter (no token on a command line)."""
    seen: list[tuple[list[str], object]] = []
    made: list[Starter] = []
    ran: list[dict[str, Any]] = []

    class Starter:
        def __init__(self, preload: list[str]) -> None:
            self.preload, self.auth_secret = preload, None
            made.append(self)

        def Popen(self, args, stdout=None, stderr=None):  # noqa: N802
            seen.append((list(args), stdout))

    monkeypatch.setattr(superexec, "AppStarter", Starter)
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    # apply() wraps flower_superexec.run_superexec: Flower's comes back after the test
    def run_superexec(runtime_api_address: str, superexec_auth_secret: bytes | None = None) -> None:
        ran.append({"runtime_api_address": runtime_api_address,
                    "superexec_auth_secret": superexec_auth_secret})

    monkeypatch.setattr(FLOWER_SUPEREXEC, "run_superexec", run_superexec)
    starter = superexec.apply({superexec.ENV: "numpy"})
    assert made == [starter] and starter.preload == ["numpy"]
    spec = ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:9094",
                         token="t0k", insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=42,
                         suppress_output=False, task_id=7)
    subprocess_executor.SubprocessExecutor().launch(spec)
    assert seen == [(["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token",
                      "t0k", "--insecure", "--parent-pid", "42"], None)]
    FLOWER_SUPEREXEC.run_superexec(runtime_api_address="x", superexec_auth_secret=b"s")
    assert ran == [{"runtime_api_address": "x", "superexec_auth_secret": b"s"}]
    assert starter.auth_secret == derive_auth_secret(b"s")
    # nothing to import ahead: spawned, and still routed (Flower's Popen would show the token)
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    monkeypatch.setattr(FLOWER_SUPEREXEC, "run_superexec", run_superexec)
    spawned = superexec.apply({superexec.ENV: ""})
    assert made[-1] is spawned and spawned.preload == []
    assert subprocess_executor.subprocess is not subprocess
    assert subprocess_executor.subprocess.Popen == spawned.Popen
    assert subprocess_executor.subprocess.DEVNULL == subprocess.DEVNULL


def test_it_is_flowers_superexec_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "fedsys_launch.deploy.superexec", "--help"],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**__import__("os").environ, superexec.ENV: ""}).stdout
    assert out.startswith("usage: flower-superexec") and "--runtime-api-address" in out
