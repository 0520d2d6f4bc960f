"""The ``flwr`` CLI of a deployment: its connection ``fedsys-local`` (:func:`connection_toml`),
the nodes and runs it lists, and the submission of the fedsys app (:class:`FlwrCli`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsys.config import toml_text
from fedsys_launch.deploy.errors import DeployError, RunNotStartedError
from fedsys_launch.deploy.fab_staging import staged_app
from fedsys_launch.process.flower_env import deployment_env
from fedsys_launch.process.supervision import descendants, signal_all

CONNECTION = "fedsys-local"


def console_script(name: str) -> str:
    """The command ``name`` (``flwr``) installed beside this interpreter, else the one on
    ``PATH``."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


@dataclass
class FlwrCli:
    """The ``flwr`` CLI with its home ``home`` (``FLWR_HOME``, holding the connection
    ``fedsys-local``); a submission's output goes under ``logs``."""

    home: Path
    logs: Path

    def call(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``flwr ARGS`` with this CLI home."""
        return subprocess.run([console_script("flwr"), *args], cwd=self.home,
                              env={**deployment_env(), "FLWR_HOME": str(self.home),
                                   "COLUMNS": os.environ.get("COLUMNS", "160")},
                              capture_output=True, text=True, timeout=timeout, check=False)

    def nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list`` as dicts (``node-id``, ``status``, ...)."""
        proc = self.call("supernode", "list", CONNECTION, "--format", "json")
        try:
            return list(json.loads(proc.stdout)["nodes"])
        except (ValueError, KeyError):
            raise DeployError(f"flwr supernode list failed:\n{proc.stdout}{proc.stderr}") from None

    def runs(self) -> list[dict[str, Any]]:
        """``flwr ls`` as dicts (``run-id``, ``fab-id``, ``status``, ``elapsed``, ...)."""
        proc = self.call("ls", CONNECTION, "--format", "json")
        try:
            return list(json.loads(proc.stdout)["runs"])
        except (ValueError, KeyError):
            raise DeployError(f"flwr ls failed:\n{proc.stdout}{proc.stderr}") from None

    def submit(self, app_dir: Path, run_config: Mapping[str, object],
               log: Path | None = None) -> subprocess.Popen[str]:
        """Start ``flwr run APP fedsys-local --stream`` in the background.

        Its output goes to ``log``, or to a pipe when ``log`` is ``None`` and the caller
        reads ``stdout``.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        app_dir = staged_app(app_dir, self.home)
        rc_file = self.home / f"run-config-{time.time_ns()}.toml"
        rc_file.write_text(run_config_toml(run_config))
        rc_file.chmod(0o600)
        out = (os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
               if log is not None else None)
        try:
            return subprocess.Popen(
                [console_script("flwr"), "run", str(app_dir), CONNECTION, "--stream",
                 "--run-config", str(rc_file)],
                cwd=self.home, env={**deployment_env(), "FLWR_HOME": str(self.home)},
                stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()

    def run(self, app_dir: Path, run_config: Mapping[str, object], timeout: float = 600,
            echo: bool = False) -> str:
        """``flwr run APP fedsys-local --stream``; return its output (``echo``: also print it)."""
        log = self.logs / f"flwr-run-{time.time_ns()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = self.submit(app_dir, run_config, log)
        end = time.monotonic() + timeout
        with log.open(errors="replace") as f:
            while True:
                done = proc.poll() is not None
                chunk = f.read()
                if echo and chunk:
                    print(chunk, end="", flush=True)
                if done:
                    break
                if time.monotonic() > end:
                    signal_all(descendants(proc.pid), signal.SIGKILL)
                    proc.wait()
                    raise RuntimeError(f"flwr run took longer than {timeout:.0f} s; "
                                       f"output in {log}")
                time.sleep(0.2)
        out = log.read_text(errors="replace")
        run_id = started_run(out)
        if run_id is None:
            raise RunNotStartedError(f"flwr run exited {proc.returncode} before a run started "
                                     f"(output in {log}):\n{out[-3000:]}")
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run failed (exit {proc.returncode}):\n{out[-3000:]}")
        status = self.run_status(run_id)
        if status != "finished:completed":  # flwr run --stream exits 0 however the run ended
            raise RuntimeError(f"run {run_id} ended {status} (flwr ls); its log:\n{out[-3000:]}")
        return out

    def run_status(self, run_id: int) -> str:
        """The status ``flwr ls`` gives run ``run_id`` (``finished:completed``,
        ``finished:failed``, ...)."""
        proc = self.call("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        try:
            rows = json.loads(proc.stdout)["runs"]
            return str(next(r["status"] for r in rows if str(r["run-id"]) == str(run_id)))
        except (ValueError, KeyError, StopIteration):
            raise DeployError(f"flwr ls --run-id {run_id} failed:\n{proc.stdout}{proc.stderr}") \
                from None


def started_run(flwr_run_output: str) -> int | None:
    """The run id in ``flwr run``'s "Successfully started run N" line (``None``: none)."""
    m = re.search(r"Successfully started run (\d+)", flwr_run_output)
    return int(m.group(1)) if m else None


def run_config_toml(run_config: Mapping[str, object]) -> str:
    """A ``--run-config`` TOML file: one (quoted) dotted key per line, as Flower flattens it."""
    return toml_text(run_config)


def connection_toml(address: str, ca_cert: Path | str | None) -> str:
    """The flwr CLI's ``config.toml``: the connection ``fedsys-local`` to ``address``, over
    TLS with ``ca_cert`` or insecure without one."""
    link: dict[str, object] = {"address": address}
    if ca_cert is None:
        link["insecure"] = True
    else:
        link["root-certificates"] = str(ca_cert)
    return toml_text({"superlink": {"default": CONNECTION, CONNECTION: link}})
