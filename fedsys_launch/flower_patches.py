"""Every change fedsys makes to Flower's own code, in one module.

fedsys runs Flower's SuperLink, SuperNode, SuperExec and simulation runtime as Flower ships
them, but for the seven behaviours below, each of which cost replies, processes or time
where it was measured (docs/performance.md, "What each patch of Flower buys").  Each is a
:class:`Patch`: the Flower releases it was written for, what Flower does and what the patch
makes it do, what that buys, and a check of its target (a function's parameters, a
constant's shape, the attributes it reads) made when it is applied.  A target that does
not match, as a Flower release that changed it would, skips that patch with one WARNING
naming it, and fedsys runs on with Flower's own behaviour: slower, or with Flower's own
timeouts.  ``FEDSYS_FLOWER_PATCHES`` turns patches off by name (comma-separated, or
``none`` for all), for a measurement or a bug report against plain Flower.

Not patches, because they use Flower's public API only: :func:`fedsys.transport.
send_and_receive` (a round's messages over ``Grid.push_messages``/``pull_messages``, which
reads one name of Flower's, the class name ``InMemoryGrid``, to poll its own process
faster) and the in-process engine's ``Grid`` (:mod:`fedsys_launch.inprocess`).  Not Flower's: the
shim that keeps a Ray node joining on 127.0.0.1 (``fedsys_launch.raycluster._JOIN_ON_LOOPBACK``,
for the tests of a two-node cluster on one machine).

``make test-flwr-next`` runs the unit tests and one simulation against the newest Flower
pre-release the package index serves, where a WARNING of this module is the first thing to
look for.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

ENV = "FEDSYS_FLOWER_PATCHES"
_LOG = logging.getLogger("flwr")  # Flower's logger: the WARNING appears where Flower's lines do


@dataclass(frozen=True)
class Patch:
    """One change to Flower: see the module docstring."""

    name: str
    target: str
    versions: str
    upstream: str
    change: str
    buys: str


PATCHES: dict[str, Patch] = {p.name: p for p in (
    Patch("sqlite-busy-timeout", "flwr.supercore.sql_mixin.SQLITE_PRAGMAS", "1.41, 1.42",
          "the SuperLink's SQLite connections wait 5 s for the write lock, then answer 500 "
          "'database is locked', and a SuperNode drops the reply it was pushing",
          "they wait FEDSYS_SQLITE_BUSY_TIMEOUT_MS (120 s)",
          "10 SuperNodes replying at once on 2 cores: 2 of 10 replies lost a round without it, "
          "none with it (benchmarks/deploy_load.py)"),
    Patch("superlink-start-window", "flwr.supercore.corestate.sql_corestate.SqlCoreState."
          "claim_task", "1.41, 1.42",
          "a claimed ServerApp task not checked in within 30 s is started a second time, two "
          "ServerApps then driving one run",
          "the claimed task waits FEDSYS_CLIENTAPP_START_S (300 s) for its process",
          "one ServerApp per run on a machine busy enough to take over 30 s to import torch"),
    Patch("supernode-start-window", "flwr.supercore.corestate.in_memory_corestate."
          "InMemoryCoreState.claim_task", "1.41, 1.42",
          "a claimed ClientApp task not checked in within 30 s goes back to pending and a "
          "second ClientApp is started, the first left running",
          "the claimed task waits FEDSYS_CLIENTAPP_START_S (300 s) for its ClientApp",
          "30 SuperNodes on 2 cores: 375 ClientApp processes and the machine's 23 GiB used "
          "within two minutes without it; one ClientApp per message with it "
          "(benchmarks/deploy_load.py)"),
    Patch("warm-app-processes", "flwr.supercore.superexec.executor.subprocess_executor."
          "SubprocessExecutor.launch", "1.41, 1.42",
          "each app process is a fresh interpreter that imports torch and Flower first "
          "(about 5.5 s of CPU a message on 2 cores)",
          "each is forked from a fork server that imported torch and NumPy once "
          "(FEDSYS_APP_PRELOAD)", "benchmarks/warm_start.py: the same run's app processes "
          "start warm (docs/performance.md)"),
    Patch("prompt-dispatch", "flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue",
          "1.41, 1.42",
          "the simulation runtime looks for the ServerApp's new messages every 0.1 s",
          "the same loop also wakes the moment a message is stored",
          "about 50 ms a simulated round (benchmarks/client_overhead.py)"),
    Patch("task-identity", "flwr.supercore.task_identity.TaskIdentity", "1.41, 1.42",
          "a Message is made only inside a task of a run, whose identity Flower's runtime "
          "sets for its app processes",
          "the in-process engine sets it for the ServerApp and each ClientApp call it makes",
          "the in-process engine itself (docs/performance.md, 'The in-process engine'); "
          "without it, engine 'inprocess' runs as engine 'flower'"),
    Patch("orderly-shutdown", "flwr.server.superlink.fleet.vce.backend.raybackend.RayBackend",
          "1.41, 1.42",
          "when a simulation stops, Ray is shut down while the runtime's worker threads may "
          "still be in a Ray call, and such a thread ends the process at once (exit 1)",
          "Ray is shut down once no worker thread is in a Ray call (up to SHUTDOWN_GRACE_S, "
          "5 s; later messages get an error reply without reaching Ray)",
          "a stopped run exits 130/143 saying how to continue (was: exit 1 and no word, once "
          "in a CI run of the SIGTERM test)"),
)}

_warned: set[str] = set()
_warn_lock = threading.Lock()


def turned_off(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``FEDSYS_FLOWER_PATCHES`` turns patch ``name`` off."""
    text = environ.get(ENV, "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    return "none" in names or name in names


def skip(name: str, why: str) -> None:
    """One WARNING per process: patch ``name`` is not applied, and why."""
    with _warn_lock:
        if name in _warned:
            return
        _warned.add(name)
    p = PATCHES[name]
    _LOG.warning("fedsys: Flower patch '%s' not applied: %s (written for flwr %s; this is %s). "
                 "Flower's own behaviour stays: %s", name, why, p.versions, flower_version(),
                 p.upstream)


def flower_version() -> str:
    """The installed Flower's version: the distribution ``flwr``, or Flower's nightly
    build ``flwr-nightly`` (which installs the same module), or ``not installed``."""
    from importlib import metadata

    for dist in ("flwr", "flwr-nightly"):
        try:
            return metadata.version(dist) + ("" if dist == "flwr" else " (nightly)")
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _parameters(fn: object) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _usable(name: str, why: str | None, environ: Mapping[str, str]) -> bool:
    """Whether patch ``name`` goes in: not turned off, and its target matches (``why`` is
    None); else :func:`skip` says why (a patch turned off says so at INFO)."""
    if turned_off(name, environ):
        _LOG.info("fedsys: Flower patch '%s' turned off (%s)", name, ENV)
        return False
    if why is not None:
        skip(name, why)
        return False
    return True


# ------------------------------------------------------------------ sqlite-busy-timeout

PRAGMAS = "SQLITE_PRAGMAS"  # read by flwr.supercore.sql_mixin on every new connection


def check_busy_timeout() -> str | None:
    """Why :func:`sqlite_busy_timeout` cannot go in, or None."""
    try:
        from flwr.supercore import sql_mixin
    except ImportError as exc:
        return f"no flwr.supercore.sql_mixin ({exc})"
    pragmas = getattr(sql_mixin, PRAGMAS, None)
    try:
        ok = "busy_timeout" in dict(pragmas)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ok = False
    return None if ok else f"sql_mixin.{PRAGMAS} is not pairs holding busy_timeout"


def with_busy_timeout(pragmas: tuple[tuple[str, str], ...], ms: int) -> tuple[tuple[str, str], ...]:
    """``pragmas`` with ``busy_timeout`` set to ``ms``."""
    return tuple((k, str(ms) if k == "busy_timeout" else v) for k, v in pragmas)


def sqlite_busy_timeout(ms: int, environ: Mapping[str, str] = os.environ) -> bool:
    """Make every SQLite connection the SuperLink opens from now on wait ``ms`` for a lock
    (Flower sets its pragmas on each new connection); whether it went in."""
    if not _usable("sqlite-busy-timeout", check_busy_timeout(), environ):
        return False
    from flwr.supercore import sql_mixin

    setattr(sql_mixin, PRAGMAS, with_busy_timeout(getattr(sql_mixin, PRAGMAS), ms))
    return True


# ------------------------------------------------------------------ start windows

def check_superlink_claim() -> str | None:
    """Why :func:`superlink_start_window` cannot go in, or None."""
    try:
        from flwr.supercore.corestate.sql_corestate import SqlCoreState
        from flwr.supercore.state.schema.corestate_models import Task
    except ImportError as exc:
        return f"a module it reads is gone ({exc})"
    if _parameters(getattr(SqlCoreState, "claim_task", None)) != ("self", "task_id"):
        return "SqlCoreState.claim_task is not claim_task(self, task_id)"
    missing = [c for c in ("task_id", "token", "active_until") if not hasattr(Task, c)]
    if missing or not callable(getattr(SqlCoreState, "session", None)):
        return f"the task table lacks {', '.join(missing) or 'a session'}"
    return None


def superlink_start_window(seconds: float, environ: Mapping[str, str] = os.environ) -> bool:
    """Give every task the SuperLink hands out from now on ``seconds`` (at least Flower's
    own 30 s) for its app process to check in; whether it went in."""
    if not _usable("superlink-start-window", check_superlink_claim(), environ):
        return False
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL
    from flwr.supercore.corestate.sql_corestate import SqlCoreState
    from flwr.supercore.date import now
    from flwr.supercore.state.schema.corestate_models import Task
    from flwr.supercore.utils import uint64_to_int64
    from sqlalchemy import update

    claim = SqlCoreState.claim_task

    def claim_task(self: SqlCoreState, task_id: int) -> str | None:
        token = claim(self, task_id)
        if token is not None:
            until = now() + timedelta(seconds=max(seconds, HEARTBEAT_DEFAULT_INTERVAL))
            with self.session() as session:
                session.execute(update(Task).where(Task.task_id == uint64_to_int64(task_id),
                                                   Task.token == token)
                                .values(active_until=until))
        return token

    claim_task.__doc__ = claim.__doc__
    SqlCoreState.claim_task = claim_task  # type: ignore[method-assign]
    return True


def check_supernode_claim() -> str | None:
    """Why :func:`supernode_start_window` cannot go in, or None."""
    try:
        from flwr.supercore.corestate.in_memory_corestate import InMemoryCoreState
    except ImportError as exc:
        return f"a module it reads is gone ({exc})"
    if _parameters(getattr(InMemoryCoreState, "claim_task", None)) != ("self", "task_id"):
        return "InMemoryCoreState.claim_task is not claim_task(self, task_id)"
    try:
        source = inspect.getsource(InMemoryCoreState)
    except (OSError, TypeError):
        return "InMemoryCoreState's source cannot be read"
    missing = [a for a in ("task_token_store", "lock_task_store", "active_until")
               if a not in source]
    return f"InMemoryCoreState has no {', '.join(missing)}" if missing else None


def supernode_start_window(seconds: float, environ: Mapping[str, str] = os.environ) -> bool:
    """Give every task the SuperNode hands out from now on ``seconds`` (at least Flower's
    own window) for its ClientApp to check in; whether it went in."""
    if not _usable("supernode-start-window", check_supernode_claim(), environ):
        return False
    from flwr.supercore.corestate.in_memory_corestate import InMemoryCoreState
    from flwr.supercore.date import now

    claim = InMemoryCoreState.claim_task

    def claim_task(self: InMemoryCoreState, task_id: int) -> str | None:
        token = claim(self, task_id)
        if token is not None:
            with self.lock_task_store:
                record = self.task_token_store.get(task_id)
                if record is not None and record.token == token:
                    record.active_until = max(record.active_until,
                                              now() + timedelta(seconds=seconds))
        return token

    claim_task.__doc__ = claim.__doc__
    InMemoryCoreState.claim_task = claim_task  # type: ignore[method-assign]
    return True


# ------------------------------------------------------------------ warm-app-processes

def check_executor() -> str | None:
    """Why :func:`warm_app_processes` cannot go in, or None."""
    import subprocess

    try:
        from flwr.supercore.superexec.executor import subprocess_executor as executor
    except ImportError as exc:
        return f"no subprocess executor ({exc})"
    launch = getattr(getattr(executor, "SubprocessExecutor", None), "launch", None)
    if not callable(launch) or getattr(executor, "subprocess", None) is not subprocess:
        return "SubprocessExecutor.launch does not start its process with subprocess.Popen"
    return None


def warm_app_processes(start: Callable[[], Callable[..., Any]],
                       environ: Mapping[str, str] = os.environ) -> bool:
    """Route Flower's ``SubprocessExecutor`` through the ``Popen`` (``subprocess.Popen``'s
    arguments) that ``start()`` returns (:class:`fedsys_launch.superexec.WarmStarter`'s, its fork
    server started only when the patch goes in); whether it went in."""
    if not _usable("warm-app-processes", check_executor(), environ):
        return False
    import subprocess
    from types import SimpleNamespace

    from flwr.supercore.superexec.executor import subprocess_executor as executor

    executor.subprocess = SimpleNamespace(  # type: ignore[assignment,attr-defined]
        Popen=start(), DEVNULL=subprocess.DEVNULL)
    return True


# ------------------------------------------------------------------ prompt-dispatch

#: The parameters of Flower's ``vce_api.add_messages_to_queue`` that :func:`_dispatch`
#: replaces.
DISPATCH_PARAMETERS = ("state", "queue", "nodes_mapping", "f_stop")


def check_dispatch() -> str | None:
    """Why :func:`prompt_dispatch` cannot go in, or None."""
    try:
        from flwr.server.superlink.fleet.vce import vce_api
    except ImportError as exc:
        return f"no vce_api ({exc})"
    found = _parameters(getattr(vce_api, "add_messages_to_queue", None))
    if found != DISPATCH_PARAMETERS:
        return f"vce_api.add_messages_to_queue takes {found}, not {DISPATCH_PARAMETERS}"
    return None


def _dispatch(state: Any, queue: Any, nodes_mapping: Mapping[int, Any],
              f_stop: threading.Event, idle: float = 0.1) -> None:
    """Flower's loop that moves each node's next message from the LinkState to the
    runtime's queue, woken as soon as a message is stored, not only every ``idle`` s."""
    wake = threading.Event()
    store = state.store_message_ins

    def store_and_wake(*args: Any, **kwargs: Any) -> Any:
        out = store(*args, **kwargs)
        wake.set()
        return out

    state.store_message_ins = store_and_wake  # this state object only
    try:
        while not f_stop.is_set():
            wake.clear()  # a message stored from here on wakes the wait below
            for node_id in nodes_mapping.keys():
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            wake.wait(idle)
    finally:
        del state.store_message_ins


@contextlib.contextmanager
def prompt_dispatch(environ: Mapping[str, str] = os.environ) -> Iterator[bool]:
    """Within it, Flower's simulation runtime takes a message the moment the ServerApp
    stores it (:func:`_dispatch`: Flower's loop, each node's next message one at a time,
    that also wakes when a message is stored); yields whether it is in place.  Flower's
    own is put back after."""
    if not _usable("prompt-dispatch", check_dispatch(), environ):
        yield False
        return
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue
    vce_api.add_messages_to_queue = _dispatch
    try:
        yield True
    finally:
        vce_api.add_messages_to_queue = original


# ------------------------------------------------------------------ orderly-shutdown

#: Seconds the Ray backend's ``terminate`` waits for the ClientApp calls in flight to return
#: before it shuts Ray down; after that it leaves Ray as it is (the process is ending: the
#: command exits at most 10 s later, ``fedsys_launch.cli.exit_now_if_threads_linger``).
SHUTDOWN_GRACE_S = 5.0
#: The parameters of Flower's ``RayBackend`` methods that :func:`orderly_shutdown` wraps.
BACKEND_PARAMETERS = {"process_message": ("self", "message", "context"), "terminate": ("self",)}


def check_orderly_shutdown() -> str | None:
    """Why :func:`orderly_shutdown` cannot go in, or None."""
    try:
        from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    except ImportError as exc:
        return f"no Ray backend ({exc})"
    for name, expected in BACKEND_PARAMETERS.items():
        found = _parameters(getattr(RayBackend, name, None))
        if found != expected:
            return f"RayBackend.{name} takes {found}, not {expected}"
    return None


class _InFlight:
    """The ClientApp calls one backend has in flight, and whether it is closing."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.calls = 0
        self.closing = False


_in_flight_lock = threading.Lock()


def _in_flight(backend: Any) -> _InFlight:
    with _in_flight_lock:
        state = vars(backend).get("_fedsys_in_flight")
        if state is None:
            state = backend._fedsys_in_flight = _InFlight()
        return state


def _wrap_backend(process_message: Callable[..., Any], terminate: Callable[[Any], None],
                  grace: Callable[[], float]) -> tuple[Callable[..., Any], Callable[[Any], None]]:
    """Flower's ``process_message`` and ``terminate`` of its Ray backend, ordered: a call
    made once ``terminate`` has begun is answered with an error reply without reaching Ray;
    ``terminate`` waits up to ``grace()`` seconds for the calls in flight, then runs
    Flower's own (the actors ended, Ray shut down) only if none is left."""

    def ordered_process_message(self: Any, message: Any, context: Any) -> Any:
        state = _in_flight(self)
        with state.changed:
            if state.closing:
                from flwr.app import Error, Message
                from flwr.common.constant import ErrorCode

                return Message(Error(code=ErrorCode.UNKNOWN, reason="the simulation is "
                                     "stopping: message not delivered"),
                               reply_to=message), context
            state.calls += 1
        try:
            return process_message(self, message, context)
        finally:
            with state.changed:
                state.calls -= 1
                state.changed.notify_all()

    def ordered_terminate(self: Any) -> None:
        state = _in_flight(self)
        with state.changed:
            state.closing = True
            drained = state.changed.wait_for(lambda: state.calls == 0, timeout=grace())
            left = state.calls
        if drained:
            terminate(self)
        else:
            _LOG.debug("fedsys: %d ClientApp call(s) still running after %.0f s: Ray is left "
                       "to the process's exit", left, grace())

    return ordered_process_message, ordered_terminate


@contextlib.contextmanager
def orderly_shutdown(environ: Mapping[str, str] = os.environ) -> Iterator[bool]:
    """Within it, Flower's Ray backend shuts Ray down only once no thread of the simulation
    runtime is inside a Ray call (:func:`_wrap_backend`); yields whether it is in place.
    Flower's own methods are put back after.

    Why: when a run stops (Ctrl-C, SIGTERM, an error), Flower's runtime sets its stop event
    and calls ``RayBackend.terminate`` (``ray.shutdown()``) from the main thread while its
    worker threads may still wait on an actor's reply or submit a message they had taken.
    A thread that reaches Ray's core worker while it shuts down ends the whole process at
    once with exit status 1 ("The core worker has already been shutdown", ray-project/ray
    #19115): the stop's exit status and its word on how to continue were lost (CI,
    2026-12-06); a call still waiting fails (the actor's owner gone), and a submit after
    the shutdown starts a new local Ray cluster.
    """
    if not _usable("orderly-shutdown", check_orderly_shutdown(), environ):
        yield False
        return
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    originals = RayBackend.process_message, RayBackend.terminate
    ordered = _wrap_backend(*originals, grace=lambda: SHUTDOWN_GRACE_S)
    RayBackend.process_message = ordered[0]  # type: ignore[method-assign]
    RayBackend.terminate = ordered[1]  # type: ignore[method-assign,assignment]
    try:
        yield True
    finally:
        RayBackend.process_message, RayBackend.terminate = originals  # type: ignore[method-assign]


# ------------------------------------------------------------------ task-identity

_IDENTITY = ("_task_id", "_run_id", "_node_id")


def check_task_identity() -> str | None:
    """Why :func:`task_identity` cannot go in, or None."""
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError as exc:
        return f"no flwr.supercore.task_identity ({exc})"
    meta = type(TaskIdentity)
    missing = [n for n in ("task_id", "run_id", "node_id")
               if getattr(getattr(meta, n, None), "fset", None) is None
               or f"_{n}" not in vars(TaskIdentity)]
    return f"TaskIdentity has no settable {', '.join(missing)}" if missing else None


def task_identity_usable(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether :func:`task_identity` can be used (the in-process engine asks before it
    starts; a WARNING says why not)."""
    return _usable("task-identity", check_task_identity(), environ)


@contextlib.contextmanager
def task_identity(task_id: int, run_id: int, node_id: int) -> Iterator[None]:
    """Flower's :class:`TaskIdentity` (which every new ``Message`` reads) set to this task
    within, and put back as it was after (possibly unset)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = [vars(TaskIdentity).get(n) for n in _IDENTITY]
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = task_id, run_id, node_id
    try:
        yield
    finally:
        for n, v in zip(_IDENTITY, saved, strict=True):
            setattr(TaskIdentity, n, v)


#: Each patch's check of its target, by name (the tests run every one).
CHECKS: dict[str, Callable[[], str | None]] = {
    "sqlite-busy-timeout": check_busy_timeout,
    "superlink-start-window": check_superlink_claim,
    "supernode-start-window": check_supernode_claim,
    "warm-app-processes": check_executor,
    "prompt-dispatch": check_dispatch,
    "task-identity": check_task_identity,
    "orderly-shutdown": check_orderly_shutdown,
}


__all__ = ["CHECKS", "DISPATCH_PARAMETERS", "ENV", "PATCHES", "Patch", "check_busy_timeout",
           "check_dispatch", "check_executor", "check_orderly_shutdown",
           "check_superlink_claim", "check_supernode_claim", "check_task_identity",
           "flower_version", "orderly_shutdown", "prompt_dispatch", "skip",
           "sqlite_busy_timeout", "superlink_start_window", "supernode_start_window",
           "task_identity", "task_identity_usable", "turned_off", "warm_app_processes",
           "with_busy_timeout"]
