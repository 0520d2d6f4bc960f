"""One exchange of training messages between the server and its nodes (a round's, or a
chain's hop): to which node each instruction went, under which key the node was sampled
and with which model (:class:`Exchange`); sending it and asking again for the replies lost
on the way (:func:`send`, :func:`resend_lost`), the training traffic (:class:`Traffic`) and
the split of the replies into usable updates and refusals (:func:`sort_replies`).  A
strategy makes one :class:`Exchange` per exchange and passes it to what reads it; nothing
else holds a round's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys import transport, validation
from fedsys.params import Params
from fedsys.validation import ClientUpdate, Rejection
from strategies.nodes import Known

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


def sort_replies(replies: Iterable[Message], ex: Exchange, known: Known, *, weighted_by_key: str,
                 read: set[str], check: Callable[[ClientUpdate], str | None],
                 max_examples_ratio: float, on_lacks_weight: Callable[[], None], label: str
                 ) -> tuple[list[ClientUpdate], list[Rejection]]:
    """Split the replies to ``ex`` into usable updates (by partition) and logged refusals.

    A reply's ``partition-id``, where it reports one, is the node's key from then on (the
    first report is kept in ``known``); a reply reporting another than the node's first,
    or one another connected node holds, is refused, as are a node's second reply, a
    reply ``check`` finds unusable for the method, a claimed weight out of bounds
    (:func:`fedsys.validation.weight_refusals`) and a missing reply.
    ``on_lacks_weight`` is called for a reply without ``weighted_by_key``.
    """
    replies = list(replies)
    sent = ex.sent()
    ok: list[ClientUpdate] = []
    bad: list[Rejection] = []
    seen: set[int] = set()
    for r in replies:
        res = validation.parse_train_reply(
            r, sent, ex.expected, ex.reference(r, sent), reported=known.partition_ids,
            weighted_by_key=weighted_by_key, read=read,
        )
        if isinstance(res, ClientUpdate) and proto.PARTITION_ID in res.metrics:
            known.partition_ids.setdefault(res.node_id, res.partition_id)  # its first report
        if isinstance(res, ClientUpdate) and res.node_id in seen:
            res = Rejection(res.node_id, res.partition_id, "duplicate reply")
        if isinstance(res, ClientUpdate) and (why := check(res)) is not None:
            res = Rejection(res.node_id, res.partition_id, why)
        if isinstance(res, Rejection) and res.reason == validation.lacks(weighted_by_key):
            on_lacks_weight()
        (ok if isinstance(res, ClientUpdate) else bad).append(res)  # type: ignore[arg-type]
        seen.add(res.node_id)
    refused = validation.weight_refusals({u.node_id: float(u.num_examples) for u in ok},
                                         known.num_examples, max_examples_ratio)
    bad += [Rejection(u.node_id, u.partition_id, refused[u.node_id]) for u in ok
            if u.node_id in refused]
    ok = [u for u in ok if u.node_id not in refused]
    for node in validation.missing_nodes(sent, replies):
        bad.append(Rejection(node, ex.expected.get(node, -1), "no reply before round-timeout"))
    for rj in bad:
        log(WARNING, "[%s] rejected reply of client %d (node %d): %s",
            label, rj.partition_id, rj.node_id, rj.reason)
    return sorted(ok, key=lambda u: u.partition_id), bad


__all__ = ["TRAFFIC_KEYS", "Exchange", "Traffic", "resend_lost", "send", "sort_replies"]
