"""One exchange of training messages between the server and its nodes (a round's, or a
chain's hop): to which node each instruction went, under which key the node was sampled
and with which model (:class:`Exchange`); sending it and asking again for the replies lost
on the way (:func:`send`, :func:`resend_lost`) and the training traffic (:class:`Traffic`);
which replies are usable is :mod:`strategies.replies`'s.  A
strategy makes one :class:`Exchange` per exchange and passes it to what reads it; nothing
else holds a round's messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys import transport
from fedsys.params import Params

#: The training-traffic totals every round's record carries (:class:`Traffic`).
TRAFFIC_KEYS = ("models-down", "bytes-down", "models-up", "bytes-up")


@dataclass
class Exchange:
    """The instructions of one exchange (:meth:`strategies.base.FedsysStrategy.exchange`)."""

    #: node id -> the key it was sampled under (its partition-id, or its node id)
    expected: dict[int, int] = field(default_factory=dict)
    #: node id -> the model it was sent (a reply must match its keys, shapes and dtypes)
    payloads: dict[int, Params] = field(default_factory=dict)
    #: the instructions, as sent (a resent one replaces the one whose reply was lost)
    outbox: list[Message] = field(default_factory=list)
    #: node id -> the model record its instruction was built with (what ``payloads`` holds,
    #: as sent: a record swapped in afterwards is another model)
    records: dict[int, ArrayRecord] = field(default_factory=dict)

    def sent(self) -> dict[str, Message]:
        """Message id -> instruction, for the instructions the SuperLink accepted."""
        return {m.metadata.message_id: m for m in self.outbox if m.metadata.message_id}

    def reference(self, reply: Message, sent: Mapping[str, Message]) -> Params | None:
        """The model the instruction ``reply`` answers carried (``None``: not ours)."""
        instr = sent.get(reply.metadata.reply_to_message_id)
        return None if instr is None else self.payloads.get(instr.metadata.dst_node_id)

    def replace(self, again: Mapping[str, Message]) -> None:
        """The instructions ``again`` (old message id -> new message) were sent anew."""
        self.outbox = [m for m in self.outbox if m.metadata.message_id not in again]
        self.outbox += list(again.values())


@dataclass
class Traffic:
    """Training traffic so far: ArrayRecords and their bytes sent to the clients (down)
    and received from them (up), and the partitions (clients) sent an instruction."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRAFFIC_KEYS, 0))
    reached: set[int] = field(default_factory=set)

    def count(self, ex: Exchange, sent: Iterable[Message], replies: Iterable[Message]) -> None:
        """Add the instructions ``sent`` in ``ex`` and the ``replies`` that are not errors
        (refused replies count: they were sent)."""
        for m in sent:
            k, b = proto.model_bytes(m)
            self.counts["models-down"] += k
            self.counts["bytes-down"] += b
            self.reached.add(ex.expected.get(m.metadata.dst_node_id, m.metadata.dst_node_id))
        for r in replies:
            if not r.has_error():
                k, b = proto.model_bytes(r)
                self.counts["models-up"] += k
                self.counts["bytes-up"] += b

    def totals(self) -> dict[str, int]:
        """What every round's record carries: the counts and ``clients-reached``."""
        return {**self.counts, "clients-reached": len(self.reached)}

    def state(self) -> dict[str, Any]:
        """The checkpoint's ``traffic`` and ``reached`` entries."""
        return {"traffic": dict(self.counts), "reached": sorted(self.reached)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (a checkpoint from before every strategy counted traffic:
        a chain's own count, else 0)."""
        saved = state.get("traffic", state.get("chain", {}).get("traffic", {}))
        self.counts = {k: int(saved.get(k, 0)) for k in TRAFFIC_KEYS}
        self.reached = {int(p) for p in state.get("reached", [])}


def send(grid: Grid, ex: Exchange, traffic: Traffic, timeout: float,
         poll_interval: float) -> list[Message]:
    """Send ``ex``'s instructions, wait up to ``timeout`` for the replies, count the
    traffic; the replies."""
    replies, _ = transport.send_and_receive(grid, ex.outbox, timeout, poll_interval)
    traffic.count(ex, ex.outbox, replies)
    return replies


def resend_lost(grid: Grid, ex: Exchange, replies: list[Message], traffic: Traffic, *,
                retries: int, timeout: float, poll_interval: float, label: str,
                server_round: int) -> list[Message]:
    """Ask again, up to ``retries`` times, the nodes of ``ex`` whose train reply was lost on
    the way (:data:`fedsys.transport.TRANSPORT_ERRORS`), with the same instruction (the
    same seeds: the update is the one the first try would have given); the round's
    replies with the lost ones replaced."""
    for attempt in range(1, retries + 1):
        lost = {r.metadata.reply_to_message_id for r in replies if transport.lost_in_transport(r)}
        again = {mid: transport.resend(m) for m in ex.outbox
                 if (mid := m.metadata.message_id) in lost}
        if not again:
            break
        log(WARNING, "[%s] round %d: %d train replies lost on the way (%s); asking node(s) %s "
            "again (try %d of %d)", label, server_round, len(again),
            "; ".join(sorted({(r.error.reason or f"code {r.error.code}").split('.')[0] for r in replies
                              if r.metadata.reply_to_message_id in again})),
            ", ".join(str(m.metadata.dst_node_id) for m in again.values()), attempt, retries)
        ex.replace(again)
        new, _ = transport.send_and_receive(grid, list(again.values()), timeout, poll_interval)
        traffic.count(ex, list(again.values()), new)
        replies = [r for r in replies if r.metadata.reply_to_message_id not in again] + new
    return replies


def shared_records(payloads: Iterable[Params | ArrayRecord]) -> dict[int, ArrayRecord]:
    """Each payload's record by the payload's id, made once per payload: nodes sent the
    same model (FedAvg's global) share one record, as Flower's strategies share theirs,
    rather than each getting its own serialisation of it."""
    out: dict[int, ArrayRecord] = {}
    for p in payloads:
        if id(p) not in out:
            out[id(p)] = p if isinstance(p, ArrayRecord) else proto.to_record(p)
    return out


def as_returned(ex: Exchange, messages: list[Message], arrays_key: str,
                partition_ids: Mapping[int, int]) -> Exchange:
    """The exchange of the instructions ``configure_train`` returned (``ex``: the one it
    made).  On Flower's strategies what it returns is what is sent, so a subclass's
    override that drops, adds or changes instructions (another model for a node, a node
    left out) is honoured here too: ``ex`` when they are its own, else an exchange of
    exactly ``messages``, each reply checked against the model its instruction carried
    (``arrays_key``: the strategy's record name; ``partition_ids``: node -> the key a node
    the strategy did not sample is known by)."""
    def sent_model(m: Message) -> ArrayRecord | None:
        key = proto.model_key(m.content, arrays_key)
        return None if key is None else proto.array_records(m.content)[key]

    if len(messages) == len(ex.outbox) and all(
            m is o and (rec := sent_model(m)) is not None
            and rec is ex.records.get(m.metadata.dst_node_id)
            for m, o in zip(messages, ex.outbox, strict=True)):
        return ex
    expected: dict[int, int] = {}
    payloads: dict[int, Params] = {}
    records: dict[int, ArrayRecord] = {}
    for m in messages:
        node = m.metadata.dst_node_id
        expected[node] = ex.expected.get(node, partition_ids.get(node, node))
        if (rec := sent_model(m)) is None:
            continue
        records[node] = rec
        payloads[node] = (ex.payloads[node] if rec is ex.records.get(node) and node in ex.payloads
                          else proto.from_record(rec))
    return Exchange(expected, payloads, messages, records)


__all__ = ["TRAFFIC_KEYS", "Exchange", "Traffic", "as_returned", "resend_lost", "send", "shared_records"]
