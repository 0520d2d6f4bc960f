"""Shared test setup."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

# CPython 3.11.0-3.11.7 can fail two concurrent ``ast.parse`` calls (gh-106905), which
# Flower's simulation makes when it loads apps by reference: see ast_guard/sitecustomize.py
AST_GUARD = Path(__file__).parent / "ast_guard"
_spec = importlib.util.spec_from_file_location("fedsys_tests_ast_guard", AST_GUARD / "sitecustomize.py")
assert _spec is not None and _spec.loader is not None
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1
# uncompressed copies of the datasets' IDX files (fedsys.data.idx_cache) in /tmp, shared by
# the workers and later sessions, not in the home directory (the tests write many small ones)
os.environ.setdefault("FEDSYS_CACHE", str(Path(tempfile.gettempdir()) / f"fedsys-test-cache-{os.getuid()}"))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends a test process as Ctrl-C does, by ``KeyboardInterrupt``: pytest then
    tears the fixtures down, so a deployment's SuperLink and SuperNodes (in sessions of
    their own, which a signal to pytest's process group does not reach) and the shared Ray
    cluster are stopped, not left running (``tests/unit/test_suite_signals.py``).  Each
    xdist worker installs it too.  A process that runs a simulation in its main thread gets
    Ray's handler from then on (``ray.init`` sets one that raises ``SystemExit``): the test
    running then fails, and the fixtures are torn down as well."""
    signal.signal(signal.SIGTERM, _interrupt)


class SharedRay:
    """The test process's Ray cluster (``fedsys_launch.engines.shared_ray_cluster.ray_cluster``), started again
    when it no longer answers.

    In one CI run a worker's cluster stopped answering part-way (``Connection refused``)
    and every later simulation of that worker failed with it; the cause was not found.
    :meth:`ensure` checks the GCS port before each ``slow`` test; a dead cluster is
    replaced and the test run says so (a warning naming the test that ran before, and the
    end of the dead cluster's log), so the cause can still be looked for.
    """

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.address = ""
        self.root: Path | None = None
        self.previous_test = "(none)"

    def start(self) -> None:
        from fedsys_launch.engines.shared_ray_cluster import ray_cluster

        self.root = Path(tempfile.mkdtemp(prefix="fedsys-ray-"))  # short: Ray's socket paths
        self.stack.callback(shutil.rmtree, self.root, ignore_errors=True)
        # each xdist worker's cluster its own worker ports, outside Ray's default range
        k = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        ports = (20000 + 1000 * k, 20999 + 1000 * k)
        self.address = self.stack.enter_context(ray_cluster(self.root, num_cpus=1,
                                                            worker_ports=ports))
        os.environ["RAY_ADDRESS"] = self.address

    def ensure(self, test: str) -> None:
        from fedsys_launch.engines.simulation import ray_address_problem

        if not self.address:  # the first slow test of this process
            self.start()
            self.previous_test = test
            return
        problem = ray_address_problem({"RAY_ADDRESS": self.address}, timeout=2.0)
        if problem is not None:
            log = ""
            if self.root is not None and (self.root / "ray-start.log").exists():
                log = (self.root / "ray-start.log").read_text(errors="replace")[-1500:]
            warnings.warn(f"the suite's Ray cluster died after {self.previous_test} "
                          f"({problem}); started a new one for {test}. Its log ends:\n{log}",
                          stacklevel=1)
            self.stop()
            self.start()
        self.previous_test = test

    def stop(self) -> None:
        os.environ.pop("RAY_ADDRESS", None)
        self.address = ""
        self.stack.close()
        self.stack = contextlib.ExitStack()


@pytest.fixture(scope="session")
def _shared_ray(request: pytest.FixtureRequest) -> Iterator[SharedRay | None]:
    """Simulations in this test process join one Ray cluster through ``RAY_ADDRESS``.

    Starting and stopping a private cluster costs a simulation about 4 s of wall time and
    4 s of CPU on 2 cores (``benchmarks/ray_cluster.py``), and CI runs about 70 of them. Each
    run is still its own Ray job with fresh worker processes, so its numbers are the same
    (tests/integration/test_simulation.py compares both ways). The cluster has one CPU, so
    each run starts one ClientApp actor: Flower starts an actor per CPU, and each costs
    about 10 s of CPU importing torch and Flower's simulation modules (a short run: 21.5 s
    of CPU in a one-CPU cluster, 35.7 s in one with both cores; no test needs clients to
    train at once). Started by the process's first test marked ``slow`` (so a cluster that
    does not start fails those tests, not the unit tests beside them, as the first start
    under a loaded machine once did); ``FEDSYS_TEST_SHARED_RAY=0`` turns it off, and a ``RAY_ADDRESS`` already set is used as
    it is. A test that needs a run's own cluster asks for ``own_ray_cluster``.
    """
    slow = any(it.get_closest_marker("slow") for it in request.session.items)
    if (not slow or os.environ.get("RAY_ADDRESS")
            or os.environ.get("FEDSYS_TEST_SHARED_RAY", "1") == "0"):
        yield None
        return
    shared = SharedRay()  # started by the first slow test: a cluster that does not start
    try:                  # fails the slow tests, not the others
        yield shared
    finally:
        shared.stop()


@pytest.fixture(autouse=True)
def _ray_cluster_alive(request: pytest.FixtureRequest, _shared_ray: SharedRay | None) -> None:
    """Before each ``slow`` test: the shared cluster answers (:meth:`SharedRay.ensure`)."""
    if _shared_ray is not None and request.node.get_closest_marker("slow"):
        _shared_ray.ensure(request.node.nodeid)


@pytest.fixture
def own_ray_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's simulations start their own Ray cluster, as a user's ``fedsys run`` does."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(autouse=True)
def _flower_task_identity():
    """Messages built outside a running app need a task identity (as the runtime sets)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = 1
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    yield


class ReplyGrid:
    """A stand-in for Flower's Grid in unit tests: node ids, message ids, and replies.

    ``nodes`` maps node ids to the partition-ids they declare.  Every pulled message is
    answered: by ``answer(message)`` when given, else with a MetricRecord holding the
    node's ``partition-id`` (the answer to fedsys's query; train replies are built by
    the tests themselves with ``Message(content, reply_to=instruction)``).
    """

    def __init__(self, nodes: dict[int, int],
                 answer: Callable[[object], object] | None = None) -> None:
        self.nodes = nodes
        self.answer = answer
        self.outbox: dict[str, object] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[object]) -> list[str]:
        ids = []
        for m in messages:
            mid = str(uuid.uuid4())
            m.metadata.__dict__["_message_id"] = mid  # type: ignore[attr-defined]
            self.outbox[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[object]:
        from flwr.app import Message, MetricRecord, RecordDict

        out = []
        for i in list(ids):
            m = self.outbox.pop(i)
            if self.answer is not None:
                out.append(self.answer(m))
                continue
            pid = self.nodes[m.metadata.dst_node_id]  # type: ignore[attr-defined]
            out.append(Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}),
                               reply_to=m))
        return out


@pytest.fixture
def reply_grid() -> type[ReplyGrid]:
    """The mock grid shared by the strategy unit tests (:class:`ReplyGrid`)."""
    return ReplyGrid


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmd.read_bytes():
                out.append(int(cmd.parent.name))
        except OSError:
            continue
    return out


class FlwrLocal:
    """A private ``FLWR_HOME`` and environment for ``flwr run`` against Flower's local
    SuperLink (a detached daemon that :meth:`stop` ends by PID).

    Without the suite's ``RAY_ADDRESS``: Flower's local simulation starts its own Ray
    cluster, as it does for a user following Flower's docs (its default of 2 CPUs per
    client would not fit the suite's one-CPU cluster).
    """

    def __init__(self, home: Path) -> None:
        from fedsys_launch.process.flower_env import FLWR_ENV
        from fedsys_launch.process.supervision import free_port

        self.home = home
        self.home.mkdir()
        environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # the apps Flower's local SuperLink runs are confined (fedsys.confine): let them
        # write under the test's directory, where the tests put output-dir
        self.env = {**environ, **FLWR_ENV, "FLWR_HOME": str(home), "FEDSYS_ROOTS": str(home.parent),
                    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
                    "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
                    # the simulations it starts load both apps by reference, in two threads
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(AST_GUARD), environ.get("PYTHONPATH", "")) if p),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def start_superlink(self, timeout: float = 180.0) -> None:
        """Start Flower's managed local SuperLink the way ``flwr run`` does, allowing
        ``timeout`` seconds where flwr 1.41 allows 15 (``LOCAL_SUPERLINK_STARTUP_TIMEOUT``):
        on 2 cores shared by three test workers its start-up has taken longer, and
        ``flwr run`` then failed before doing anything.  ``flwr run`` finds it running and
        uses it, as it would its own."""
        code = ("import flwr.cli.local_superlink as m\n"
                f"m.LOCAL_SUPERLINK_STARTUP_TIMEOUT = {timeout}\n"
                "m._start_local_superlink()\n")
        proc = subprocess.run([sys.executable, "-c", code], cwd=self.home, env=self.env,
                              capture_output=True, text=True, timeout=timeout + 30, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    def stop(self) -> list[int]:
        """SIGTERM every process started under this home; return their PIDs."""
        from fedsys_launch.process.supervision import descendants

        daemons = [d for p in _procs_mentioning(str(self.home)) for d in descendants(p)]
        for pid in daemons:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return daemons


@pytest.fixture
def flwr_local(tmp_path: Path) -> Iterator[FlwrLocal]:
    """:class:`FlwrLocal` for one test, its local SuperLink started; whatever it started
    is stopped afterwards."""
    local = FlwrLocal(tmp_path / "flwr-home")
    try:
        local.start_superlink()
        yield local
    finally:
        local.stop()


class FedsysCLI:
    """``python -m fedsys_launch`` as a user runs it, in its own session (so a test can SIGKILL
    the whole run), with ``extra_path`` on ``PYTHONPATH`` for plugin modules."""

    def __init__(self, cwd: Path, extra_path: Path | None = None) -> None:
        self.cwd = cwd
        self.env = dict(os.environ)
        if extra_path is not None:
            self.env["PYTHONPATH"] = os.pathsep.join([str(extra_path),
                                                      os.environ.get("PYTHONPATH", "")])

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """Start ``fedsys ARGS`` (stdout and stderr piped)."""
        return subprocess.Popen([sys.executable, "-m", "fedsys_launch", *args], start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                cwd=self.cwd)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ``fedsys ARGS`` to the end, with Flower's environment as fedsys sets it
        (``fedsys_launch.process.flower_env.FLWR_ENV``); its exit status and output, not checked."""
        from fedsys_launch.process.flower_env import FLWR_ENV

        return subprocess.run([sys.executable, "-m", "fedsys_launch", *args], cwd=self.cwd,
                              env={**self.env, **FLWR_ENV}, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 600) -> str:
        """Wait for ``proc``; assert it succeeded; its stdout and stderr."""
        out, err = proc.communicate(timeout=timeout)
        text = out.decode(errors="replace") + err.decode(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        return text

    @staticmethod
    def kill_after(proc: subprocess.Popen[bytes], ckpt: Path, rnd: int,
                   timeout: float = 400) -> int:
        """SIGKILL the whole run once ``ckpt`` holds round ``rnd`` or later; the round it
        held when killed."""
        from fedsys import checkpoint

        end = time.monotonic() + timeout  # a wall clock that jumps must not end the wait
        held = 0
        while time.monotonic() < end:
            try:
                held = int(checkpoint.load(ckpt)["round"]) if ckpt.exists() else 0
            except checkpoint.CheckpointError:
                held = 0  # mid-write: try again
            if held >= rnd:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        # a kill between save's two renames leaves only the previous file, which resume reads
        return int(checkpoint.load_latest(ckpt)[0]["round"])


@pytest.fixture
def fedsys_cli(tmp_path: Path) -> FedsysCLI:
    """:class:`FedsysCLI` in the test's directory, with ``tests/integration`` importable."""
    return FedsysCLI(tmp_path, Path(__file__).resolve().parent / "integration")


@pytest.fixture(scope="module")
def module_fedsys_cli(tmp_path_factory: pytest.TempPathFactory) -> FedsysCLI:
    """:class:`FedsysCLI` for a module's fixtures (a deployment the module shares)."""
    return FedsysCLI(tmp_path_factory.mktemp("cli"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failed test that used a deployment (a ``dep`` fixture, ``fedsys_launch.deploy.local_deployment.
    LocalDeployment``) reports the end of every component's log beside its traceback:
    a deployment's temporary directory is gone by the time CI shows the failure."""
    outcome = yield
    rep = outcome.get_result()
    dep = getattr(item, "funcargs", {}).get("dep")
    if rep.when != "call" or not rep.failed or dep is None or not hasattr(dep, "log_file"):
        return
    logs = sorted((dep.root / "logs").glob("*.log")) if (dep.root / "logs").is_dir() else []
    for path in logs:
        if path.name.startswith("flwr-run-"):
            continue
        text = path.read_text(errors="replace")[-2500:]
        rep.sections.append((f"deployment log {path.name} (last 2500 characters)", text))
