"""The one place that builds and reads Flower messages on the server side.

Every outgoing message gets a fresh :class:`flwr.app.RecordDict`, so per-node
payloads (FedCross's K models, a FedELMY hop) need nothing special.  Replies are
turned into :class:`ClientUpdate` objects or :class:`Rejection` records that name
the node, the client and the reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid

from fedsys.params import Params, check_update

ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"
SUPERLINK_NODE_ID = 1


def to_record(params: Params) -> ArrayRecord:
    """Wrap :data:`Params` as an :class:`ArrayRecord` (order kept)."""
    return ArrayRecord({k: Array(np.require(v, requirements="C")) for k, v in params.items()})


def from_record(record: ArrayRecord) -> Params:
    """Read an :class:`ArrayRecord` back into :data:`Params`."""
    return {k: record[k].numpy() for k in record.keys()}


def config_record(config: Mapping[str, object]) -> ConfigRecord:
    """A fresh :class:`ConfigRecord` holding scalar config values."""
    return ConfigRecord({k: v for k, v in config.items()})  # type: ignore[misc]


def message(
    node_id: int,
    message_type: str,
    arrays: Params | ArrayRecord | None = None,
    config: Mapping[str, object] | None = None,
    extra: Mapping[str, ArrayRecord] | None = None,
) -> Message:
    """Build one instruction with its own RecordDict.

    ``extra`` adds further named ArrayRecords (several models in one message).
    """
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS_KEY] = arrays if isinstance(arrays, ArrayRecord) else to_record(arrays)
    for key, rec in (extra or {}).items():
        content[key] = rec
    content[CONFIG_KEY] = config_record(config or {})
    return Message(content, dst_node_id=node_id, message_type=message_type)


def query_message(node_id: int) -> Message:
    """A QUERY asking a node which partition it holds."""
    return message(node_id, MessageType.QUERY, config={"ask": "partition-id"})


def send_and_receive(
    grid: Grid, messages: Sequence[Message], timeout: float, poll: float = 0.1
) -> tuple[list[Message], dict[str, Message]]:
    """Push ``messages``, pull replies until all arrived or ``timeout`` passed.

    Returns the replies and a map from message id to the instruction sent, so a
    reply (including a SuperLink error reply, whose ``src_node_id`` is the
    SuperLink) can be traced to its node through ``reply_to_message_id``.
    """
    ids = [i for i in grid.push_messages(list(messages))]
    sent = {i: m for i, m in zip(ids, messages, strict=True) if i}
    pending = set(sent)
    replies: list[Message] = []
    end = time.monotonic() + timeout
    while pending and time.monotonic() < end:
        got = list(grid.pull_messages(list(pending)))
        replies.extend(got)
        pending -= {m.metadata.reply_to_message_id for m in got}
        if pending:
            time.sleep(poll)
    return replies, sent


@dataclass
class ClientUpdate:
    """A validated train reply."""

    node_id: int
    partition_id: int
    params: Params
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    """A reply that was not used, and why."""

    node_id: int
    partition_id: int
    reason: str


def metrics_of(content: RecordDict) -> dict[str, float]:
    """All numeric scalars of all MetricRecords in ``content``."""
    out: dict[str, float] = {}
    for rec in content.metric_records.values():
        for k, v in rec.items():
            if isinstance(v, int | float):
                out[k] = float(v)
    return out


def parse_train_reply(
    reply: Message,
    sent: Mapping[str, Message],
    expected_pid: Mapping[int, int],
    reference: Params | None,
) -> ClientUpdate | Rejection:
    """Validate one train reply against the model the node was sent.

    ``expected_pid`` maps node ids to the partition-ids sampled this round;
    ``reference`` is the model whose keys, shapes and dtypes the update must match
    (the instruction's own arrays when ``None``).
    """
    instr = sent.get(reply.metadata.reply_to_message_id)
    node = instr.metadata.dst_node_id if instr is not None else reply.metadata.src_node_id
    pid = expected_pid.get(node, -1)
    if reply.has_error():
        err = reply.error
        return Rejection(node, pid, f"error reply (code {err.code}): {str(err.reason)[-300:]}")
    content = reply.content
    if ARRAYS_KEY not in content.array_records:
        return Rejection(node, pid, f"reply holds no ArrayRecord '{ARRAYS_KEY}'")
    metrics = metrics_of(content)
    for key in ("num-examples", "partition-id"):
        if key not in metrics:
            return Rejection(node, pid, f"reply metrics lack '{key}'")
    if int(metrics["partition-id"]) != pid:
        return Rejection(
            node, pid, f"reply echoes partition-id {int(metrics['partition-id'])}, expected {pid}"
        )
    if not np.isfinite(metrics["num-examples"]) or metrics["num-examples"] <= 0:
        return Rejection(node, pid, f"num-examples is {metrics['num-examples']}")
    try:
        params = from_record(content.array_records[ARRAYS_KEY])
    except Exception as exc:
        return Rejection(node, pid, f"arrays cannot be decoded: {exc}")
    if reference is None and instr is not None and ARRAYS_KEY in instr.content.array_records:
        reference = from_record(instr.content.array_records[ARRAYS_KEY])
    if reference is not None:
        why = check_update(params, reference)
        if why is not None:
            return Rejection(node, pid, why)
    bad = [k for k, v in metrics.items() if not np.isfinite(v)]
    if bad:
        return Rejection(node, pid, f"metric(s) {bad} are NaN or Inf")
    return ClientUpdate(node, pid, params, int(metrics["num-examples"]), metrics)


def missing_nodes(sent: Mapping[str, Message], replies: Iterable[Message]) -> list[int]:
    """Nodes whose instruction got no reply at all (timeout)."""
    answered = {r.metadata.reply_to_message_id for r in replies}
    return [m.metadata.dst_node_id for i, m in sent.items() if i not in answered]


def metric_record(values: Mapping[str, float | int]) -> MetricRecord:
    """A MetricRecord of scalar values."""
    return MetricRecord({k: v for k, v in values.items()})
