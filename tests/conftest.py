"""Shared test setup."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable

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
