"""Messages to the SuperLink and back, on the server side: push, pull with a growing wait,
transient SuperLink failures tried again, and the replies that say a message was lost on
the way (so that it is sent again).  What the messages hold is :mod:`fedsys.protocol`;
whether a reply is used is :mod:`fedsys.validation`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from logging import WARNING
from typing import TypeVar

import httpx
from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

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


__all__ = ["IN_PROCESS_POLL", "TRANSPORT_ERRORS", "in_process", "lost_in_transport", "resend",
           "retry_transient", "send_and_receive", "transient"]
