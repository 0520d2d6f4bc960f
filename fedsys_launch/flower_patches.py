"""Every change fedsys makes to Flower's own code, in one module.

fedsys runs Flower's SuperLink, SuperNode, SuperExec and simulation runtime as Flower ships
them, but for the behaviours below: seven that cost replies, processes or time where it
was measured, and five that close holes of the threat model (:data:`SECURITY` and
``task-lease``; docs/deployment.md, docs/performance.md "What each patch of Flower buys").
Each is a :class:`Patch`: the Flower releases it was written for, what Flower does and what
the patch makes it do, what that buys, and a check of its target (a function's parameters,
a constant's shape, the attributes it reads) made when it is applied.  A target that does
not match, as a Flower release that changed it would, skips that patch with one WARNING
naming it, and fedsys runs on with Flower's own behaviour: slower, or with Flower's own
timeouts; a :data:`SECURITY` patch that does not match stops the component instead.  ``FEDSYS_FLOWER_PATCHES`` turns patches off by name (comma-separated, or
``none`` for all), for a measurement or a bug report against plain Flower.

Not patches, because they use Flower's public API only: :func:`fedsys.transport.
send_and_receive` (a round's messages over ``Grid.push_messages``/``pull_messages``, which
reads one name of Flower's, the class name ``InMemoryGrid``, to poll its own process
faster) and the in-process engine's ``Grid`` (:mod:`fedsys_launch.engines.inprocess`).  Not Flower's: the
shim that keeps a Ray node joining on 127.0.0.1 (``fedsys_launch.engines.shared_ray_cluster._JOIN_ON_LOOPBACK``,
for the tests of a two-node cluster on one machine).

``make test-flwr-next`` runs the unit tests and one simulation against the newest Flower
pre-release the package index serves, where a WARNING of this module is the first thing to
look for.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.app import Message

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
    Patch("task-identity", "flwr.supercore.task_identity.TaskIdentity, "
          "flwr.app.metadata.Metadata.message_id", "1.41, 1.42",
          "a Message is made only inside a task of a run, whose identity Flower's runtime "
          "sets for its app processes, and gets its id only where Flower's LinkState "
          "stores it",
          "the in-process engine sets it for the ServerApp and each ClientApp call it makes, "
          "and gives each message it keeps its id (set_message_id)",
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
    Patch("private-task-tokens", "flwr.supercore.superexec.executor.subprocess_executor."
          "SubprocessExecutor.launch, flwr.supercore.interceptors.RuntimeTokenHttpInterceptor",
          "1.41, 1.42",
          "an app process gets its task token as --token on its command line, which any local "
          "user reads in /proc/PID/cmdline, and its Runtime calls carry the token alone",
          "the token travels to the app process in memory (fork server or spawn pipe), its "
          "title shows --token ***, and the process signs each Runtime call with a key only "
          "its SuperExec could derive from the token (fedsys_launch/runtime_auth.py)",
          "a site's local user cannot take the site's tasks (issue 75; security: a target "
          "that does not fit stops the SuperExec)"),
    Patch("signed-task-calls", "flwr.supercore.dependencies.runtime.authenticate_task",
          "1.41, 1.42",
          "the Runtime API accepts every call after AcquireTask on the task token alone",
          "with a SuperExec secret set, a call must also be signed with the task's key, "
          "over its path, time, nonce and body, each signature good once",
          "a token read anywhere takes no task (security: stops the component if it does "
          "not fit)"),
    Patch("task-lease", "flwr.supernode.start_client_internal._push_messages",
          "1.41, 1.42",
          "a SuperNode waits for ever for the reply of the message it handed out: a task "
          "taken and finished without a reply, or never answered, leaves the node deaf to "
          "every later message and run",
          "a message whose task ended without a reply, or that is older than its TTL or "
          "FEDSYS_TASK_LEASE_S (3600 s), gets Flower's error reply (logged), and the node "
          "serves the next message",
          "a dropped task costs one message, not the node (issue 75)"),
    Patch("fleet-ownership", "flwr.superlink.servicer.fleet.fleet_handlers",
          "1.41, 1.42",
          "pull-object and confirm-message-received serve any object or message of a "
          "running run to any registered node, and push-messages takes a reply whatever "
          "node it names",
          "a node pulls and confirms only what was handed to it, and replies only as "
          "itself to a message handed to it (403 otherwise, logged)",
          "a registered site cannot read or break another site's downloads, nor reply for "
          "it (issue 75; security: stops the SuperLink if it does not fit)"),
    Patch("bound-node-signatures", "flwr.superlink.routers.fleet.node_auth.authenticate_node, "
          "flwr.supernode.node_auth_http_interceptor.NodeAuthHttpInterceptor",
          "1.41, 1.42",
          "a SuperNode signs a timestamp only: a captured header is good for any request "
          "within 300 s",
          "fedsys's SuperNode signs the path, time, a nonce and the body's digest, and the "
          "SuperLink takes each signature once; a plain Flower SuperNode's timestamp "
          "signature is still taken unless FEDSYS_NODE_SIGNATURES=bound",
          "no replayed or transplanted Fleet request (issue 75)"),
)}

#: patches whose absence opens a hole: a target that does not fit stops the component
#: (turning one off by FEDSYS_FLOWER_PATCHES is still the operator's choice, warned)
SECURITY = frozenset({"private-task-tokens", "signed-task-calls", "fleet-ownership",
                      "bound-node-signatures"})

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
    None); else :func:`skip` says why (a patch turned off says so at INFO).  A
    :data:`SECURITY` patch turned off is a WARNING, and one that does not fit stops the
    process: running on without it would open what it closes."""
    if turned_off(name, environ):
        level = logging.WARNING if name in SECURITY else logging.INFO
        _LOG.log(level, "fedsys: Flower patch '%s' turned off (%s)%s", name, ENV,
                 f": {PATCHES[name].upstream}" if name in SECURITY else "")
        return False
    if why is not None:
        if name in SECURITY:
            raise SystemExit(f"fedsys: Flower patch '{name}' does not fit flwr "
                             f"{flower_version()} ({why}); without it {PATCHES[name].upstream}. "
                             f"Use flwr {PATCHES[name].versions}, or accept that by "
                             f"{ENV}={name}")
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
#: command exits at most 10 s later, ``fedsys_launch.commands.cli.exit_now_if_threads_linger``).
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
    #19115): the stop's exit status and its word on how to continue are lost; a call still
    waiting fails (the actor's owner gone), and a submit after the shutdown starts a new
    local Ray cluster.
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
_MESSAGE_ID = "_message_id"  # where Metadata keeps message_id


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
    if missing:
        return f"TaskIdentity has no settable {', '.join(missing)}"
    return check_message_ids()


def check_message_ids() -> str | None:
    """Why :func:`set_message_id` cannot be used, or None: Flower's ``Metadata`` keeps its
    ``message_id`` (a property without a setter) in ``__dict__["_message_id"]``."""
    try:
        from flwr.app import Metadata
    except ImportError as exc:
        return f"no flwr.app.Metadata ({exc})"
    prop = vars(Metadata).get("message_id")
    if not isinstance(prop, property) or prop.fget is None:
        return "Metadata.message_id is not a property"
    try:
        source = inspect.getsource(prop.fget)
    except (OSError, TypeError):
        return "Metadata.message_id's source cannot be read"
    return None if _MESSAGE_ID in source else f"Metadata.message_id does not read {_MESSAGE_ID}"


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


def set_message_id(message: Message, message_id: str) -> None:
    """Give ``message`` the id ``message_id``, as Flower's LinkState does when it stores a
    message (``Metadata.message_id`` has no setter): the in-process engine keeps the
    messages itself (used where :func:`task_identity_usable`, which checks this too)."""
    message.metadata.__dict__[_MESSAGE_ID] = message_id


# ------------------------------------------------------------------ private-task-tokens

def check_token_interceptor() -> str | None:
    """Why :func:`sign_task_calls` cannot go in, or None."""
    try:
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor
    except ImportError as exc:
        return f"no RuntimeTokenHttpInterceptor ({exc})"
    if _parameters(getattr(RuntimeTokenHttpInterceptor, "intercept", None)) != (
            "self", "context", "call_next"):
        return "RuntimeTokenHttpInterceptor.intercept is not intercept(self, context, call_next)"
    try:
        source = inspect.getsource(RuntimeTokenHttpInterceptor)
    except (OSError, TypeError):
        return "RuntimeTokenHttpInterceptor's source cannot be read"
    return None if "self._token" in source else "RuntimeTokenHttpInterceptor keeps no _token"


def check_private_tokens() -> str | None:
    """Why :func:`private_task_tokens` cannot go in, or None."""
    import importlib

    try:  # the module (flwr.supercore.cli's name flower_superexec is its function)
        flower_superexec = importlib.import_module("flwr.supercore.cli.flower_superexec")
    except ImportError as exc:
        return f"no flower_superexec ({exc})"
    found = _parameters(getattr(flower_superexec, "run_superexec", None)) or ()
    if "superexec_auth_secret" not in found:
        return "flower_superexec.run_superexec takes no superexec_auth_secret"
    return check_executor() or check_token_interceptor()


def private_task_tokens(start: Callable[[], Callable[..., Any]],
                        secret: Callable[[bytes], None],
                        environ: Mapping[str, str] = os.environ) -> bool:
    """Route Flower's ``SubprocessExecutor`` through the ``Popen`` that ``start()`` returns
    (:class:`fedsys_launch.deploy.superexec.AppStarter`'s: the token in memory, the title without
    it) and hand ``secret`` the SuperExec secret Flower's ``flower-superexec`` loads (the
    task keys are made from it); whether it went in."""
    if not _usable("private-task-tokens", check_private_tokens(), environ):
        return False
    import importlib
    import subprocess
    from types import SimpleNamespace

    from flwr.supercore.superexec.executor import subprocess_executor as executor

    flower_superexec = importlib.import_module("flwr.supercore.cli.flower_superexec")

    executor.subprocess = SimpleNamespace(  # type: ignore[assignment,attr-defined]
        Popen=start(), DEVNULL=subprocess.DEVNULL)
    run = flower_superexec.run_superexec

    @functools.wraps(run)  # its signature stays Flower's: a second check still fits
    def run_superexec(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("superexec_auth_secret"):
            secret(kwargs["superexec_auth_secret"])
        return run(*args, **kwargs)

    flower_superexec.run_superexec = run_superexec  # type: ignore[attr-defined]
    return True


def sign_task_calls(keys: Mapping[str, bytes]) -> None:
    """In an app process: sign every Runtime call made with a token of ``keys`` with that
    token's key (:func:`fedsys_launch.runtime_auth.sign_task_call`), beside the token."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor

    from fedsys_launch.runtime_auth import sign_task_call

    intercept = RuntimeTokenHttpInterceptor.intercept

    def signed(self: Any, context: Any, call_next: Callable[[Any], Any]) -> Any:
        key = keys.get(self._token)
        if key is not None:
            body = context.message.SerializeToString(deterministic=True)
            context.request.headers.update(sign_task_call(key, context.request.url.path, body))
        return intercept(self, context, call_next)

    signed.__doc__ = intercept.__doc__
    RuntimeTokenHttpInterceptor.intercept = signed  # type: ignore[method-assign]


# ------------------------------------------------------------------ signed-task-calls

def check_task_auth() -> str | None:
    """Why :func:`signed_task_calls` cannot go in, or None."""
    try:
        from flwr.supercore.auth import derive_auth_secret  # noqa: F401
        from flwr.supercore.dependencies import runtime
        from flwr.supercore.protobuf.translation import get_protobuf_request  # noqa: F401
    except ImportError as exc:
        return f"a module it reads is gone ({exc})"
    found = _parameters(getattr(runtime, "authenticate_task", None))  # imported there
    if found != ("request", "token", "state"):
        return f"runtime.authenticate_task takes {found}, not (request, token, state)"
    return None


def signed_task_calls(environ: Mapping[str, str] = os.environ) -> bool:
    """Make this process's Runtime API (a SuperNode's or the SuperLink's) refuse a task's
    call that is not signed with the task's key, when it has a SuperExec secret; whether
    it went in."""
    if not _usable("signed-task-calls", check_task_auth(), environ):
        return False
    from flwr.supercore.auth import derive_auth_secret
    from flwr.supercore.dependencies import runtime
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from flwr.supercore.protobuf.translation import get_protobuf_request

    from fedsys_launch.runtime_auth import NonceStore, check_task_call, task_key

    authenticate = runtime.authenticate_task  # type: ignore[attr-defined]
    nonces = NonceStore()

    def authenticate_task(request: Any, token: str | None, state: Any) -> Any:
        task = authenticate(request, token, state)
        secret = getattr(request.app.state, "superexec_auth_secret", None)
        if secret is None or token is None:
            return task
        body = get_protobuf_request(request).SerializeToString(deterministic=True)
        why = check_task_call(task_key(derive_auth_secret(secret), token), request.url.path,
                              body, request.headers, nonces)
        if why is not None:
            _LOG.warning("fedsys: Runtime call %s of task %s refused: %s", request.url.path,
                         task.task_id, why)
            raise FlowerError(ApiErrorCode.RUNTIME_AUTHENTICATION_FAILED,
                              "Runtime task-token authentication failed.")
        return task

    authenticate_task.__doc__ = authenticate.__doc__
    runtime.authenticate_task = authenticate_task  # type: ignore[attr-defined]
    return True


# ------------------------------------------------------------------ task-lease

LEASE_ENV = "FEDSYS_TASK_LEASE_S"
LEASE_S = 3600.0


def check_task_lease() -> str | None:
    """Why :func:`task_lease` cannot go in, or None."""
    try:
        from flwr.supernode import start_client_internal as sci
        from flwr.supernode.nodestate.in_memory_nodestate import (  # noqa: F401
            CLIENT_APP_CRASHED_ERROR,
            InMemoryNodeState,
        )
    except ImportError as exc:
        return f"a module it reads is gone ({exc})"
    found = _parameters(getattr(sci, "_push_messages", None))
    if found != ("state", "object_store", "send", "push_object"):
        return f"_push_messages takes {found}"
    found = _parameters(getattr(sci, "_pull_and_store_message", None)) or ()
    if found[:2] != ("state", "object_store"):
        return f"_pull_and_store_message takes {found}"
    try:
        source = inspect.getsource(InMemoryNodeState)
    except (OSError, TypeError):
        return "InMemoryNodeState's source cannot be read"
    missing = [a for a in ("msg_store", "lock_msg_store", "is_retrieved", "_store_error_replies")
               if a not in source]
    return f"InMemoryNodeState has no {', '.join(missing)}" if missing else None


def answer_dropped(state: Any, lease_s: float, now: Callable[[], float]) -> list[str]:
    """Give Flower's error reply to each message of ``state`` (a SuperNode's) that waits
    for a reply its task will not send (:func:`fedsys_launch.runtime_auth.unanswered`);
    the reasons, logged."""
    from flwr.common.constant import Status, SubStatus
    from flwr.supernode.nodestate.in_memory_nodestate import CLIENT_APP_CRASHED_ERROR

    from fedsys_launch.runtime_auth import unanswered

    said = []
    for entry in _awaiting_reply(state):
        meta = entry.message.metadata
        tasks = state.get_tasks(run_ids=[meta.run_id],
                                statuses=[Status.PENDING, Status.STARTING, Status.RUNNING])
        why = unanswered(len(tasks), meta.created_at, meta.ttl, now(), lease_s)
        if why is None:
            continue
        for task in tasks:
            state.finish_task(task.task_id, SubStatus.FAILED, f"fedsys: {why}")
        with state.lock_msg_store:
            entry.is_retrieved = True  # Flower answers only messages handed out
        state._store_error_replies({meta.run_id}, CLIENT_APP_CRASHED_ERROR)
        said.append(f"message {meta.message_id[:12]}... of run {meta.run_id}: {why}")
        _LOG.warning("fedsys: message %s of run %s %s: error reply sent, the node serves "
                     "the next message", meta.message_id[:12], meta.run_id, why)
    return said


def task_lease(lease_s: float, environ: Mapping[str, str] = os.environ,
               poll_s: float = 0.5) -> bool:
    """Make the SuperNode stop waiting for a reply its task will not send
    (:func:`answer_dropped`); whether it went in."""
    if not _usable("task-lease", check_task_lease(), environ):
        return False
    import time

    from flwr.supernode import start_client_internal as sci

    push, pull = sci._push_messages, sci._pull_and_store_message

    @functools.wraps(pull)
    def _pull_and_store_message(*args: Any, **kwargs: Any) -> int | None:
        run_id: int | None = pull(*args, **kwargs)
        if run_id is None:  # nothing to answer now: nothing may wait to be answered later
            drop_unanswerable(kwargs["state"], kwargs["object_store"])
        return run_id

    def _push_messages(state: Any, object_store: Any, send: Any, push_object: Any) -> None:
        claimed: set[int] = set()
        while not _has_reply(state):
            answer_dropped(state, lease_s, time.time)
            claimed = _given_back(state, claimed)
            if not _has_reply(state):
                time.sleep(poll_s)
        push(state, object_store, send, push_object)

    _push_messages.__doc__ = push.__doc__
    sci._push_messages = _push_messages
    sci._pull_and_store_message = _pull_and_store_message
    return True


def drop_unanswerable(state: Any, object_store: Any) -> list[str]:
    """Delete the messages a SuperNode stored but will not answer, and stop their tasks.

    Flower's node handles one message at a time: when a pull ends without a message to
    answer, none may be left waiting.  A message whose run stopped while the node pulled
    its objects is left behind by Flower 1.41/1.42 (its ``RunNotRunningException`` path
    deletes neither it nor its task): its ClientApp then answers it after the node's next
    pull, and the node sends every later reply one message late, missing each round's
    timeout.  The ids dropped, logged.
    """
    from flwr.common.constant import Status, SubStatus

    dropped = []
    for entry in _awaiting_reply(state):
        meta = entry.message.metadata
        for task in state.get_tasks(run_ids=[meta.run_id],
                                    statuses=[Status.PENDING, Status.STARTING, Status.RUNNING]):
            state.finish_task(task.task_id, SubStatus.STOPPED, "fedsys: message dropped")
        state.delete_messages(message_ids=[meta.message_id])
        object_store.delete(meta.message_id)
        dropped.append(meta.message_id)
        _LOG.warning("fedsys: message %s of run %s will not be answered (its run stopped while "
                     "it arrived): dropped with its task", meta.message_id[:12], meta.run_id)
    return dropped


def _given_back(state: Any, claimed: set[int]) -> set[int]:
    """The node's claimed tasks now; a task claimed before and pending now was given back
    (Flower's start window passed without its app process checking in): logged."""
    from flwr.common.constant import Status

    tasks = state.get_tasks(statuses=[Status.PENDING, Status.STARTING])
    for task in tasks:
        if task.task_id in claimed and task.status.status == Status.PENDING:
            _LOG.warning("fedsys: task %s of run %s was claimed and its app process did not "
                         "check in within the start window: given back to the SuperExec",
                         task.task_id, task.run_id)
    return {t.task_id for t in tasks if t.status.status == Status.STARTING}


def _awaiting_reply(state: Any) -> list[Any]:
    """The entries of a SuperNode's store that are messages to it with no reply stored."""
    with state.lock_msg_store:
        entries = list(state.msg_store.values())
    replied = {e.message.metadata.reply_to_message_id for e in entries}
    return [e for e in entries if not e.message.metadata.reply_to_message_id
            and e.message.metadata.message_id not in replied]


def _has_reply(state: Any) -> bool:
    with state.lock_msg_store:
        return any(e.message.metadata.reply_to_message_id and not e.is_retrieved
                   for e in state.msg_store.values())


# ------------------------------------------------------------------ fleet-ownership

def check_fleet_ownership() -> str | None:
    """Why :func:`fleet_ownership` cannot go in, or None."""
    try:
        from flwr.superlink.servicer.fleet import fleet_handlers as fh
    except ImportError as exc:
        return f"no fleet_handlers ({exc})"
    want = {"pull_messages": ("request", "state", "store"),
            "push_messages": ("request", "state"),
            "pull_object": ("request", "state"),
            "confirm_message_received": ("request", "state", "store")}
    for name, params in want.items():
        found = _parameters(getattr(fh, name, None))
        if found != params:
            return f"fleet_handlers.{name} takes {found}, not {params}"
    return None


def fleet_ownership(environ: Mapping[str, str] = os.environ) -> bool:
    """Make the SuperLink's Fleet API serve a node only what was handed to it
    (:class:`fedsys_launch.runtime_auth.Ownership`); whether it went in."""
    if not _usable("fleet-ownership", check_fleet_ownership(), environ):
        return False
    from fastapi import HTTPException
    from flwr.common.constant import Status
    from flwr.superlink.servicer.fleet import fleet_handlers as fh

    from fedsys_launch.runtime_auth import Ownership, reply_refusal

    own = Ownership()
    pull_messages, push_messages = fh.pull_messages, fh.push_messages
    pull_object, confirm = fh.pull_object, fh.confirm_message_received

    def refuse(what: str, node: int, why: str, state: Any, run: int) -> None:
        """403, unless the run no longer runs: Flower's handler then refuses it in its own
        words, which a SuperNode reads as the run's end."""
        status = state.get_run_status({run}).get(run)
        if status is not None and status.status != Status.RUNNING:
            return
        _LOG.warning("fedsys: Fleet %s of node %s refused: %s", what, node, why)
        raise HTTPException(status_code=403, detail=f"{what} refused: not this node's")

    def forget_ended(state: Any) -> None:
        runs = own.runs()
        if runs:
            for run, st in state.get_run_status(runs).items():
                if st.status == Status.FINISHED:
                    own.forget_run(run)

    def pull_messages_owned(request: Any, state: Any, store: Any) -> Any:
        response = pull_messages(request, state, store)
        for msg, tree in zip(response.messages_list, response.message_object_trees, strict=True):
            own.handed(request.node.node_id, msg.metadata.run_id, msg.metadata.message_id,
                       _tree_ids(tree))
        forget_ended(state)
        return response

    def push_messages_owned(request: Any, state: Any) -> Any:
        for msg in request.messages_list:
            why = reply_refusal(request.node.node_id, msg.metadata.src_node_id,
                                msg.metadata.run_id, msg.metadata.reply_to_message_id, own)
            if why is not None:
                refuse("push-messages", request.node.node_id, why, state, msg.metadata.run_id)
        return push_messages(request, state)

    def pull_object_owned(request: Any, state: Any) -> Any:
        if not own.may_pull(request.node.node_id, request.run_id, request.object_id):
            refuse("pull-object", request.node.node_id,
                   f"object {request.object_id[:12]}... is not in a message handed to it",
                   state, request.run_id)
        return pull_object(request, state)

    def confirm_owned(request: Any, state: Any, store: Any) -> Any:
        if not own.may_confirm(request.node.node_id, request.run_id, request.message_object_id):
            refuse("confirm-message-received", request.node.node_id,
                   f"message {request.message_object_id[:12]}... was not handed to it",
                   state, request.run_id)
        return confirm(request, state, store)

    fh.pull_messages, fh.push_messages = pull_messages_owned, push_messages_owned
    fh.pull_object, fh.confirm_message_received = pull_object_owned, confirm_owned
    return True


def _tree_ids(tree: Any) -> list[str]:
    """Every object id of an ``ObjectTree`` (Flower's protobuf), its root included."""
    out, todo = [], [tree]
    while todo:
        t = todo.pop()
        out.append(t.object_id)
        todo.extend(t.children)
    return out


# ------------------------------------------------------------------ bound-node-signatures

SIGNATURES_ENV = "FEDSYS_NODE_SIGNATURES"


def check_node_signatures() -> str | None:
    """Why :func:`bound_node_signatures` cannot go in, or None."""
    try:
        from flwr.superlink.routers.fleet import node_auth
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
    except ImportError as exc:
        return f"a module it reads is gone ({exc})"
    if _parameters(getattr(node_auth, "authenticate_node", None)) != ("request",):
        return "node_auth.authenticate_node is not authenticate_node(request)"
    try:
        source = inspect.getsource(NodeAuthHttpInterceptor)
    except (OSError, TypeError):
        return "NodeAuthHttpInterceptor's source cannot be read"
    missing = [a for a in ("_private_key", "_public_key_bytes") if a not in source]
    return f"NodeAuthHttpInterceptor has no {', '.join(missing)}" if missing else None


def sign_node_requests(environ: Mapping[str, str] = os.environ) -> bool:
    """In a SuperNode: sign each Fleet request's path, time, a nonce and its body's digest
    with the node's key; whether it went in."""
    if not _usable("bound-node-signatures", check_node_signatures(), environ):
        return False
    import secrets
    from base64 import b64encode

    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import sign_message
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    from fedsys_launch.runtime_auth import NODE_BODY, NODE_NONCE, canonical, digest

    def intercept(self: Any, context: Any, call_next: Callable[[Any], Any]) -> Any:
        ts, nonce = now().isoformat(), secrets.token_hex(16)
        body = digest(context.message.SerializeToString(deterministic=True))
        signed = sign_message(self._private_key,
                              canonical(context.request.url.path, ts, nonce, body))
        context.request.headers.update({
            FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(self._public_key_bytes).decode("ascii"),
            TIMESTAMP_HEADER: ts, NODE_NONCE: nonce, NODE_BODY: body,
            FLEET_HTTP_SIGNATURE_HEADER: b64encode(signed).decode("ascii")})
        return call_next(context)

    intercept.__doc__ = NodeAuthHttpInterceptor.intercept.__doc__
    NodeAuthHttpInterceptor.intercept = intercept  # type: ignore[method-assign]
    return True


def bound_node_signatures(environ: Mapping[str, str] = os.environ) -> bool:
    """In the SuperLink: check a bound node signature (path, time, nonce, body; each
    nonce once) where the request carries one, else Flower's timestamp signature unless
    ``FEDSYS_NODE_SIGNATURES=bound``; whether it went in."""
    if environ.get(SIGNATURES_ENV, "") not in ("", "bound"):
        raise SystemExit(f"{SIGNATURES_ENV}={environ[SIGNATURES_ENV]!r}: give 'bound' (refuse "
                         "Flower's timestamp-only signatures) or leave it unset")
    if not _usable("bound-node-signatures", check_node_signatures(), environ):
        return False
    import datetime
    from base64 import b64decode

    from fastapi import HTTPException
    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature
    from flwr.superlink.routers.fleet import node_auth

    from fedsys_launch.runtime_auth import (
        MAX_SKEW_S,
        NODE_BODY,
        NODE_NONCE,
        NonceStore,
        canonical,
        digest,
    )

    require = environ.get(SIGNATURES_ENV, "") == "bound"
    flower_check = node_auth.authenticate_node
    nonces = NonceStore()

    def refuse(why: str) -> None:
        _LOG.warning("fedsys: Fleet request refused: %s", why)
        raise HTTPException(status_code=401, detail="Invalid SuperNode authentication")

    def authenticate_node(request: Any) -> None:
        nonce, body_sha = request.headers.get(NODE_NONCE), request.headers.get(NODE_BODY)
        if not (nonce and body_sha):
            if require:
                refuse(f"{request.url.path} without a bound signature ({SIGNATURES_ENV}=bound)")
            return flower_check(request)
        try:
            ts = request.headers[TIMESTAMP_HEADER]
            age = (now() - datetime.datetime.fromisoformat(ts)).total_seconds()
            key = b64decode(request.headers[FLEET_HTTP_PUBLIC_KEY_HEADER], validate=True)
            sig = b64decode(request.headers[FLEET_HTTP_SIGNATURE_HEADER], validate=True)
            body = request.state.protobuf_request.SerializeToString(deterministic=True)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            return refuse(f"{request.url.path}: unreadable signature headers ({exc})")
        if not abs(age) < MAX_SKEW_S:
            return refuse(f"{request.url.path}: signed {age:.0f} s from now")
        if digest(body) != body_sha:
            return refuse(f"{request.url.path}: body does not match its signature")
        if not verify_signature(bytes_to_public_key(key),
                                canonical(request.url.path, ts, nonce, body_sha), sig):
            return refuse(f"{request.url.path}: signature does not match the key")
        if not nonces.reserve(nonce, now().timestamp() + 2 * MAX_SKEW_S):
            return refuse(f"{request.url.path}: signature used before")
        # the identity part of Flower's check, with a signature it accepts for this key
        return _flower_identity(request)

    node_auth.authenticate_node = authenticate_node
    return True


def _flower_identity(request: Any) -> None:
    """Flower's node check for the key and node id of a request whose bound signature was
    verified: the node id the request names must be the key's (or the key the request
    registers/activates)."""
    from base64 import b64decode

    from fastapi import HTTPException
    from flwr.proto.fleet_pb2 import ActivateNodeRequest, RegisterNodeFleetRequest
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER
    from flwr.superlink.dependencies.linkstate import get_linkstate

    key = b64decode(request.headers[FLEET_HTTP_PUBLIC_KEY_HEADER], validate=True)
    proto = request.state.protobuf_request
    if isinstance(proto, RegisterNodeFleetRequest | ActivateNodeRequest):
        ok = proto.public_key == key
    else:
        node_id = proto.node.node_id if hasattr(proto, "node") else proto.node_id
        ok = get_linkstate(request).get_node_id_by_public_key(key) == node_id
    if not ok:
        _LOG.warning("fedsys: Fleet request %s refused: the node id is not the key's",
                     request.url.path)
        raise HTTPException(status_code=401, detail="Invalid SuperNode authentication")


#: Each patch's check of its target, by name (the tests run every one).
CHECKS: dict[str, Callable[[], str | None]] = {
    "sqlite-busy-timeout": check_busy_timeout,
    "superlink-start-window": check_superlink_claim,
    "supernode-start-window": check_supernode_claim,
    "warm-app-processes": check_executor,
    "prompt-dispatch": check_dispatch,
    "task-identity": check_task_identity,
    "orderly-shutdown": check_orderly_shutdown,
    "private-task-tokens": check_private_tokens,
    "signed-task-calls": check_task_auth,
    "task-lease": check_task_lease,
    "fleet-ownership": check_fleet_ownership,
    "bound-node-signatures": check_node_signatures,
}


__all__ = [
    "CHECKS",
    "DISPATCH_PARAMETERS",
    "ENV",
    "LEASE_ENV",
    "LEASE_S",
    "PATCHES",
    "SECURITY",
    "SIGNATURES_ENV",
    "Patch",
    "answer_dropped",
    "bound_node_signatures",
    "check_busy_timeout",
    "check_dispatch",
    "check_executor",
    "check_fleet_ownership",
    "check_message_ids",
    "check_node_signatures",
    "check_orderly_shutdown",
    "check_private_tokens",
    "check_superlink_claim",
    "check_supernode_claim",
    "check_task_auth",
    "check_task_identity",
    "check_task_lease",
    "check_token_interceptor",
    "drop_unanswerable",
    "fleet_ownership",
    "flower_version",
    "orderly_shutdown",
    "private_task_tokens",
    "prompt_dispatch",
    "set_message_id",
    "sign_node_requests",
    "sign_task_calls",
    "signed_task_calls",
    "skip",
    "sqlite_busy_timeout",
    "superlink_start_window",
    "supernode_start_window",
    "task_identity",
    "task_identity_usable",
    "task_lease",
    "turned_off",
    "with_busy_timeout",
]
