"""The fedsys message protocol: every key of every Flower message, on both sides.

One module defines what the server sends and what a ClientApp answers, so the
strategies (:mod:`strategies`) and the ClientApp build and read messages with the
same names.  No message key is written as a string literal anywhere else (a unit
test checks).  The protocol follows Flower's own conventions, so a ClientApp written
from Flower's quickstart speaks it:

* a **train instruction** holds the model in the ArrayRecord ``"arrays"`` and its
  settings in the ConfigRecord ``"config"`` (``server-round``, ``lr``, ``local-epochs``,
  ..., and method keys such as ``fedprox.mu``), typed: ints stay ints, floats floats,
  strings and bools as they are; further models (anchors, a pool) travel as extra
  ArrayRecords ``"model.<name>"``;
* a **train reply** holds the trained model in ``"arrays"`` and one MetricRecord
  ``"metrics"`` with ``num-examples`` (required, as Flower's FedAvg requires it; a
  strategy's ``weighted_by_key`` names it) and, optionally, ``train-loss``,
  ``local-steps``, ``partition-id`` and any other numbers (Flower's app template:
  ``train_loss``, which a strategy's ``train_loss_key`` names); extra models (a pool,
  ingredients) as ``"model.<name>"`` ArrayRecords;
* an **evaluate instruction / reply**: ``"arrays"`` + ``"config"``, and ``"metrics"``
  with ``num-examples``, ``eval-loss``, ``eval-acc``;
* a **query**, sent only where the server asks for it (``query_partitions``), asks a
  node which partition it holds (``partition-id``, ``num-partitions``); otherwise a
  node's partition is the ``partition-id`` its first train reply reports, and a node
  that reports none is keyed by its node id.

Each message gets its own :class:`~flwr.app.RecordDict`, so per-node payloads need
nothing special.  Replies are turned into :class:`ClientUpdate` objects, or
:class:`Rejection` records that name the node, the client and the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from logging import WARNING
from typing import Any, TypeVar

import httpx
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
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsys.options import Scalar
from fedsys.params import Params, check_update

# ---------------------------------------------------------------- record names
ARRAYS = "arrays"  #: the model (Flower's ``arrayrecord_key`` default)
CONFIG = "config"  #: the settings (Flower's ``configrecord_key`` default)
METRICS = "metrics"  #: the reply's numbers
MODEL_PREFIX = "model."  #: extra named models: ``model.<name>``
STATE_PREFIX = "fedsys.state"  #: a trainer's state in ``context.state``: ``fedsys.state[<scope>]``

# ---------------------------------------------------------------- config keys
SERVER_ROUND = "server-round"
TRAINER = "trainer"
STATE_SCOPE = "fedsys.scope"  #: which strategy of the run a trainer's state belongs to
LR = "lr"
LOCAL_EPOCHS = "local-epochs"
LOCAL_STEPS = "local-steps"
BATCH_SIZE = "batch-size"
MOMENTUM = "momentum"
OPTIMIZER = "optimizer"
TRAINABLE = "trainable"  #: all, or head (the classifier layer only)
WEIGHT_DECAY = "weight-decay"
WARMUP_EPOCHS = "warmup-epochs"  #: plain epochs before the method's training (a chain's first hop)
INIT_SEED = "init-seed"  #: re-initialise the model from this seed first (own-init variants)
ASK = "ask"

# ---------------------------------------------------------------- metric keys
NUM_EXAMPLES = "num-examples"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
TRAIN_LOSS = "train-loss"
#: the training loss as Flower's app template reports it and Flower's ``QFedAvg`` reads
#: it (``train_loss_key``): a strategy's default, fedsys's own ClientApp says ``train-loss``
FLOWER_TRAIN_LOSS = "train_loss"
#: examples the local training went through (every epoch, every model a trainer trains):
#: the client-training work the results compare methods on
TRAINED_EXAMPLES = "trained-examples"
EVAL_LOSS = "eval-loss"
EVAL_ACC = "eval-acc"

SUPERLINK_NODE_ID = 1


# ---------------------------------------------------------------- arrays

def to_record(params: Params) -> ArrayRecord:
    """Wrap :data:`Params` as an :class:`ArrayRecord` (order kept)."""
    return ArrayRecord({k: Array(np.require(v, requirements="C")) for k, v in params.items()})


def from_record(record: ArrayRecord) -> Params:
    """Read an :class:`ArrayRecord` back into :data:`Params`."""
    return {k: record[k].numpy() for k in record.keys()}


def model_bytes(message: Message) -> tuple[int, int]:
    """``(models, bytes)`` a message carries: its ArrayRecords and their serialised
    size (every array's bytes as they travel)."""
    if not message.has_content():
        return 0, 0
    recs = list(message.content.array_records.values())
    return len(recs), sum(len(a.data) for r in recs for a in r.values())


def config_record(config: Mapping[str, object]) -> ConfigRecord:
    """A fresh :class:`ConfigRecord` holding scalar config values (types kept)."""
    return ConfigRecord({k: v for k, v in config.items()})  # type: ignore[misc]


def extra_models(content: RecordDict) -> dict[str, Params]:
    """The named extra models (``model.<name>`` ArrayRecords) of a message."""
    return {k[len(MODEL_PREFIX):]: from_record(r) for k, r in content.array_records.items()
            if k.startswith(MODEL_PREFIX)}


def settings(content: RecordDict) -> dict[str, Scalar]:
    """The ConfigRecord ``config`` of a message as a plain typed dict."""
    if CONFIG not in content.config_records:
        return {}
    return {k: v for k, v in content.config_records[CONFIG].items()}  # type: ignore[misc]


def metrics_of(content: RecordDict) -> dict[str, float]:
    """All numeric scalars of all MetricRecords in ``content``."""
    out: dict[str, float] = {}
    for rec in content.metric_records.values():
        for k, v in rec.items():
            if isinstance(v, int | float):
                out[k] = float(v)
    return out


# ---------------------------------------------------------------- instructions

def message(
    node_id: int,
    message_type: str,
    arrays: Params | ArrayRecord | None = None,
    config: Mapping[str, object] | None = None,
    models: Mapping[str, Params] | None = None,
) -> Message:
    """Build one instruction with its own RecordDict.

    ``models`` adds further named models (``model.<name>`` ArrayRecords): anchors, a
    pool, a per-node payload beside the main model.
    """
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS] = arrays if isinstance(arrays, ArrayRecord) else to_record(arrays)
    for name, m in (models or {}).items():
        content[MODEL_PREFIX + name] = to_record(m)
    content[CONFIG] = config_record(config or {})
    return Message(content, dst_node_id=node_id, message_type=message_type)


#: Flower error codes of a message or reply lost on the way (not the ClientApp's
#: fault): MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE.
TRANSPORT_ERRORS = frozenset({3, 4, 5})


def lost_in_transport(reply: Message) -> bool:
    """Whether ``reply`` is an error saying the instruction or its reply was lost."""
    return reply.has_error() and int(reply.error.code) in TRANSPORT_ERRORS


def resend(instruction: Message) -> Message:
    """A new message carrying ``instruction``'s content to the same node."""
    return Message(instruction.content, dst_node_id=instruction.metadata.dst_node_id,
                   message_type=instruction.metadata.message_type)


def query_message(node_id: int) -> Message:
    """A QUERY asking a node which partition it holds."""
    return message(node_id, MessageType.QUERY, config={ASK: PARTITION_ID})


# ---------------------------------------------------------------- client replies

def train_reply(
    instruction: Message, model: Params | ArrayRecord, num_examples: int,
    metrics: Mapping[str, float | int], models: Mapping[str, Params] | None = None,
) -> Message:
    """The reply of a ClientApp to a train instruction."""
    content = RecordDict({
        ARRAYS: model if isinstance(model, ArrayRecord) else to_record(model),
        METRICS: MetricRecord({NUM_EXAMPLES: int(num_examples), **dict(metrics)}),
    })
    for name, m in (models or {}).items():
        content[MODEL_PREFIX + name] = to_record(m)
    return Message(content, reply_to=instruction)


def evaluate_reply(instruction: Message, num_examples: int, loss: float, acc: float,
                   extra: Mapping[str, float | int] | None = None) -> Message:
    """The reply of a ClientApp to an evaluate instruction."""
    rec = MetricRecord({**dict(extra or {}), NUM_EXAMPLES: int(num_examples),
                        EVAL_LOSS: float(loss), EVAL_ACC: float(acc)})
    return Message(RecordDict({METRICS: rec}), reply_to=instruction)


def query_reply(instruction: Message, partition_id: int, num_partitions: int,
                num_examples: int | None = None) -> Message:
    """The reply of a ClientApp to a partition-id query (with the partition's training
    size when given: the most ``num-examples`` its train replies may claim)."""
    rec = MetricRecord({PARTITION_ID: int(partition_id), NUM_PARTITIONS: int(num_partitions)})
    if num_examples is not None:
        rec[NUM_EXAMPLES] = int(num_examples)
    return Message(RecordDict({METRICS: rec}), reply_to=instruction)


def weight_refusals(claims: Mapping[int, float], declared: Mapping[int, int],
                    max_ratio: float) -> dict[int, str]:
    """Replies whose claimed ``num-examples`` would let them take over an aggregate.

    A node that declared its partition's size (its answer to the query) may claim up
    to that.  A node that declared none may claim up to ``max_ratio`` times the median
    of the *other* replies' claims in the round (leave-one-out, so one huge claim cannot
    move its own yardstick; 0 turns this bound off; a round with one reply has none):
    honest partitions can differ in size by far more than any fixed ratio, so the
    declared size is the check, the ratio the fallback.  Returns ``{node: reason}``
    with the numbers.
    """
    import statistics

    out: dict[int, str] = {}
    for node, n in claims.items():
        if node in declared:
            if n > declared[node]:
                out[node] = (f"claims num-examples {n:g}, but its partition holds "
                             f"{declared[node]} (its answer to the query)")
            continue
        others = [v for k, v in claims.items() if k != node]
        if max_ratio > 0 and others:
            med = statistics.median(others)
            if med > 0 and n > max_ratio * med:
                out[node] = (f"claims num-examples {n:g}, {n / med:.3g} times the median "
                             f"{med:g} of the round's other replies (max-examples-ratio "
                             f"{max_ratio:g})")
    return out


# ---------------------------------------------------------------- trainer state

State = dict[str, Any]


def _state_key(scope: str) -> str:
    return f"{STATE_PREFIX}[{scope}]"


def state_to_records(state: Mapping[str, Any], into: RecordDict, scope: str) -> None:
    """Store a trainer's state (scalars and :data:`Params`) in ``context.state``.

    Scalars (and lists of them) go into the ConfigRecord ``fedsys.state[<scope>]``,
    each model into an ArrayRecord ``fedsys.state[<scope>].<key>``; what the state no
    longer holds is removed.  ``scope`` keeps the states of the strategies of one run
    (and of their trainers) apart.  A value of another kind raises ``TypeError`` naming
    its key, before anything stored is touched.
    """
    scalar = bool | int | float | str | bytes
    values: dict[str, Any] = {}
    models: dict[str, ArrayRecord] = {}
    for k, v in state.items():
        if isinstance(v, dict) and all(isinstance(a, np.ndarray) for a in v.values()):
            models[k] = to_record(v)
        elif isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar)
                                                                   for x in v)):
            values[k] = v
        else:
            raise TypeError(f"trainer state '{k}' is a {type(v).__name__}: a state holds "
                            "scalars, lists of scalars and models ({name: ndarray})")
    base = _state_key(scope)
    for k in [k for k in into.keys() if k == base or k.startswith(base + ".")]:
        del into[k]
    for k, rec in models.items():
        into[f"{base}.{k}"] = rec
    into[base] = ConfigRecord(values)


def state_from_records(records: RecordDict, scope: str) -> State:
    """Read back what :func:`state_to_records` stored (empty on a node's first round)."""
    base = _state_key(scope)
    out: State = {}
    if base in records.config_records:
        out.update(dict(records.config_records[base].items()))
    for k, r in records.array_records.items():
        if k.startswith(base + "."):
            out[k[len(base) + 1:]] = from_record(r)
    return out


# ---------------------------------------------------------------- server side

def _push(grid: Grid, messages: list[Message]) -> list[str]:
    return list(grid.push_messages(messages))


def _pull(grid: Grid, ids: list[str]) -> list[Message]:
    return list(grid.pull_messages(ids))


#: The first wait between pulls, and the longest, where the SuperLink is in this process
#: (Flower's simulation engine, its ``InMemoryGrid``): a pull there is a look-up under a
#: lock, not a request, and the 0.1 s first wait of a remote SuperLink cost every simulated
#: round about 50 ms (``benchmarks/client_overhead.py``).
IN_PROCESS_POLL = (0.01, 0.05)


def in_process(grid: Grid) -> bool:
    """Whether ``grid`` talks to a SuperLink in this process (simulation), not over the
    network (named, not imported: Flower moved the class between releases)."""
    return type(grid).__name__ == "InMemoryGrid"


def send_and_receive(
    grid: Grid, messages: Sequence[Message], timeout: float, poll: float = 0.1,
    max_poll: float = 0.5,
) -> tuple[list[Message], dict[str, Message]]:
    """Push ``messages``, pull replies until all arrived or ``timeout`` passed.

    Every pull of a remote SuperLink is a write to its SQLite state, so the wait between
    pulls grows by half after every pull that brought nothing, up to ``max_poll`` and to a
    tenth of the time waited so far: a quick reply is seen at once, a late one at most
    about 10 % (and ``max_poll``) later, and a long round does not keep the SuperLink's
    database busy.  With the SuperLink in this process (:func:`in_process`) the waits are
    at most :data:`IN_PROCESS_POLL`.  The last wait ends at the deadline and one more pull
    follows, so a reply that arrived before ``timeout`` is never refused for a wait that
    overran it.  A transient failure of a push or pull is tried again
    (:func:`retry_transient`).

    Returns the replies and a map from message id to the instruction sent, so a
    reply (including a SuperLink error reply, whose ``src_node_id`` is the
    SuperLink) can be traced to its node through ``reply_to_message_id``.
    """
    if in_process(grid):
        poll, max_poll = min(poll, IN_PROCESS_POLL[0]), min(max_poll, IN_PROCESS_POLL[1])
    end = time.monotonic() + timeout
    ids = retry_transient(partial(_push, grid, list(messages)), "push-messages", end)
    sent = {i: m for i, m in zip(ids, messages, strict=True) if i}
    pending = set(sent)
    replies: list[Message] = []
    wait, start = poll, time.monotonic()
    while pending:
        got = retry_transient(partial(_pull, grid, list(pending)), "pull-messages", end)
        replies.extend(got)
        pending -= {m.metadata.reply_to_message_id for m in got}
        left = end - time.monotonic()
        if not pending or left <= 0:
            break
        wait = poll if got else min(max_poll, wait * 1.5,
                                    max(poll, (time.monotonic() - start) / 10))
        time.sleep(min(wait, left))  # the last pull is at the deadline, not a wait past it
    return replies, sent


T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    """Whether a SuperLink call failed in a way worth trying again: the connection
    (refused, reset, timed out) or a server-side error (HTTP 5xx, for example Flower
    1.41's SuperLink answering 500 when its SQLite state is locked for longer than
    its 5 s busy timeout on a busy machine).  A 4xx is an answer, not a failure."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)


def retry_transient(call: Callable[[], T], what: str, deadline: float,
                    first_wait: float = 0.5, max_wait: float = 8.0) -> T:
    """``call()``, tried again after a transient failure (:func:`transient`) with a
    doubling wait, each failure logged, until ``deadline`` (``time.monotonic()``);
    then the last failure is raised.  Other errors are raised at once."""
    wait, attempt = first_wait, 1
    while True:
        try:
            return call()
        except Exception as exc:  # transient() below picks what is tried again
            left = deadline - time.monotonic()
            if not transient(exc) or left <= 0:
                raise
            wait = min(wait, max_wait, left)
            log(WARNING, "SuperLink %s failed (attempt %d: %s); trying again in %.1f s",
                what, attempt, exc, wait)
            time.sleep(wait)
            wait, attempt = wait * 2, attempt + 1


@dataclass
class ClientUpdate:
    """A validated train reply.

    ``partition_id`` is what the node declared (its reply's ``partition-id`` or its
    answer to the query); a node that declares none is keyed by its node id.
    """

    node_id: int
    partition_id: int
    params: Params
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    models: dict[str, Params] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    """A reply that was not used, and why."""

    node_id: int
    partition_id: int
    reason: str


def lacks(key: str) -> str:
    """The refusal of a reply without the metric ``key``."""
    return f"reply metrics lack '{key}'"


def parse_train_reply(
    reply: Message,
    sent: Mapping[str, Message],
    expected_pid: Mapping[int, int],
    reference: Params | None,
    reported: Mapping[int, int] | None = None,
    weighted_by_key: str = NUM_EXAMPLES,
    read: Collection[str] | None = None,
) -> ClientUpdate | Rejection:
    """Validate one train reply against the model the node was sent.

    ``expected_pid`` maps node ids to the keys they were sampled under this round
    (partition-ids, or node ids for nodes that reported none).  ``reported`` maps
    node ids to the partition-id each reported first (``None``: ``expected_pid``
    holds them): a reply echoing another ``partition-id`` than its node's first, or
    one that another node reported, is refused; a node's first report is its key; a
    reply echoing none is keyed as sampled.  ``reference`` is the model whose keys,
    shapes and dtypes the update must match (the instruction's own arrays when
    ``None``).  ``weighted_by_key`` names the example count (Flower's keyword).
    ``read`` lists the metrics the strategy reads: a value of one of them that is
    not a finite number refuses the reply; any other metric that is not a finite
    number is left out of :attr:`ClientUpdate.metrics` (``None``: every metric is
    read).
    """
    instr = sent.get(reply.metadata.reply_to_message_id)
    node = instr.metadata.dst_node_id if instr is not None else reply.metadata.src_node_id
    pid = expected_pid.get(node, -1)
    if reported is None:
        reported = {n: p for n, p in expected_pid.items() if n == node}
    if instr is None and sent:
        return Rejection(node, pid, "reply to a message this round did not send")
    if reply.has_error():
        err = reply.error
        return Rejection(node, pid, f"error reply (code {err.code}): {str(err.reason)[-300:]}")
    content = reply.content
    if ARRAYS not in content.array_records:
        return Rejection(node, pid, f"reply holds no ArrayRecord '{ARRAYS}'")
    odd = [k for k in content.array_records if k != ARRAYS and not k.startswith(MODEL_PREFIX)]
    if odd:
        return Rejection(node, pid, f"reply holds unexpected ArrayRecord(s) {odd} (expected "
                         f"'{ARRAYS}' and named models '{MODEL_PREFIX}<name>')")
    odd = [k for k in content.metric_records if k != METRICS] + list(content.config_records)
    if odd:
        return Rejection(node, pid, f"reply holds unexpected record(s) {odd} (expected one "
                         f"MetricRecord '{METRICS}')")
    def is_read(k: str) -> bool:
        return read is None or k in read

    if METRICS in content.metric_records:
        typed = [k for k, v in content.metric_records[METRICS].items()
                 if is_read(k) and (not isinstance(v, int | float) or isinstance(v, bool))]
        if typed:
            return Rejection(node, pid, f"metric(s) {typed} are not numbers")
    metrics = {k: v for k, v in metrics_of(content).items() if is_read(k) or np.isfinite(v)}
    w = weighted_by_key
    if w not in metrics:
        return Rejection(node, pid, lacks(w))
    n = metrics[w]
    if np.isfinite(n) and n != int(n):
        return Rejection(node, pid, f"{w} is {n:g}, not a whole number")
    if PARTITION_ID in metrics:
        claim = metrics[PARTITION_ID]
        if not np.isfinite(claim) or claim != int(claim):
            return Rejection(node, pid, f"{PARTITION_ID} is {claim:g}, not a whole number")
        first = reported.get(node)
        if first is not None and int(claim) != first:
            return Rejection(node, pid, f"reply echoes {PARTITION_ID} {int(claim)}, expected "
                             f"{first} (the node's first report; a partition does not change)")
        holder = next((m for m, p in reported.items() if p == int(claim) and m != node), None)
        if holder is not None:
            return Rejection(node, pid, f"reply echoes {PARTITION_ID} {int(claim)}, which node "
                             f"{holder} reported")
        pid = int(claim)
    elif node in reported:
        pid = reported[node]
    if not np.isfinite(metrics[w]) or metrics[w] <= 0:
        return Rejection(node, pid, f"{w} is {metrics[w]}")
    try:
        params = from_record(content.array_records[ARRAYS])
        models = extra_models(content)
    except Exception as exc:
        return Rejection(node, pid, f"arrays cannot be decoded: {exc}")
    if reference is None and instr is not None and ARRAYS in instr.content.array_records:
        reference = from_record(instr.content.array_records[ARRAYS])
    if reference is not None:
        for name, m in [("", params), *models.items()]:
            why = check_update(m, reference)
            if why is not None:
                return Rejection(node, pid, f"model '{name}': {why}" if name else why)
    bad = [k for k, v in metrics.items() if not np.isfinite(v)]
    if bad:
        return Rejection(node, pid, f"metric(s) {bad} are NaN or Inf")
    if metrics.get(TRAINED_EXAMPLES, 0) < 0:  # the work the results compare methods on
        return Rejection(node, pid, f"{TRAINED_EXAMPLES} is {metrics[TRAINED_EXAMPLES]:g}")
    return ClientUpdate(node, pid, params, int(metrics[w]), metrics, models)


def missing_nodes(sent: Mapping[str, Message], replies: Iterable[Message]) -> list[int]:
    """Nodes whose instruction got no reply at all (timeout)."""
    answered = {r.metadata.reply_to_message_id for r in replies}
    return [m.metadata.dst_node_id for i, m in sent.items() if i not in answered]


def metric_record(values: Mapping[str, float | int]) -> MetricRecord:
    """A MetricRecord of scalar values."""
    return MetricRecord({k: v for k, v in values.items()})


__all__ = [
    "ARRAYS",
    "ASK",
    "BATCH_SIZE",
    "CONFIG",
    "EVAL_ACC",
    "EVAL_LOSS",
    "FLOWER_TRAIN_LOSS",
    "LOCAL_EPOCHS",
    "LOCAL_STEPS",
    "LR",
    "METRICS",
    "MODEL_PREFIX",
    "MOMENTUM",
    "NUM_EXAMPLES",
    "NUM_PARTITIONS",
    "PARTITION_ID",
    "SERVER_ROUND",
    "STATE_PREFIX",
    "STATE_SCOPE",
    "SUPERLINK_NODE_ID",
    "TRAINER",
    "TRAIN_LOSS",
    "TRANSPORT_ERRORS",
    "WEIGHT_DECAY",
    "ClientUpdate",
    "Rejection",
    "State",
    "config_record",
    "evaluate_reply",
    "extra_models",
    "from_record",
    "lacks",
    "lost_in_transport",
    "message",
    "metric_record",
    "metrics_of",
    "missing_nodes",
    "model_bytes",
    "parse_train_reply",
    "query_message",
    "query_reply",
    "resend",
    "retry_transient",
    "send_and_receive",
    "settings",
    "state_from_records",
    "state_to_records",
    "to_record",
    "train_reply",
]
