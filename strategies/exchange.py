"""One exchange of training messages between the server and its nodes (a round's, or a
chain's hop): to which node each instruction went, under which key the node was sampled
and with which model.  A strategy makes one per exchange and passes it to what reads it
(validation, resends, traffic); nothing else holds a round's messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flwr.app import Message

from fedsys.params import Params


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


__all__ = ["Exchange"]
