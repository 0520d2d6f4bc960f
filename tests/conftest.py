"""Shared test setup."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1


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
    SuperLink (a detached daemon that :meth:`stop` ends by PID)."""

    def __init__(self, home: Path) -> None:
        from launch.deploy import free_port
        from launch.simulation import FLWR_ENV

        self.home = home
        self.home.mkdir()
        self.env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(home),
                    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
                    "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def stop(self) -> list[int]:
        """SIGTERM every process started under this home; return their PIDs."""
        from launch.deploy import descendants

        daemons = [d for p in _procs_mentioning(str(self.home)) for d in descendants(p)]
        for pid in daemons:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return daemons


@pytest.fixture
def flwr_local(tmp_path: Path) -> Iterator[FlwrLocal]:
    """:class:`FlwrLocal` for one test; whatever it started is stopped afterwards."""
    local = FlwrLocal(tmp_path / "flwr-home")
    try:
        yield local
    finally:
        local.stop()
