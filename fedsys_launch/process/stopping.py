"""Ctrl-C and SIGTERM stop a run: the exception where the signal lands, and the same stop
again between rounds.

Python runs a signal handler between two bytecodes of the main thread; an exception it
raises there is lost when those bytecodes belong to a finaliser or a weakref callback
(``__del__`` of a temporary file, a tensor's storage: Python prints "Exception ignored"
and goes on).  A run could then miss its SIGTERM and train on to its last round.  So the
handler also records the signal, and :func:`raise_if_stopped`, called by the ServerApp's
round hook after each round's checkpoint, raises the stop once more: a lost exception
costs at most one round, and the checkpoint the run leaves is whole.
"""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt` (the same stop)."""


_received: list[int] = []  #: the stop signals this process received, in order


def on_signal(signum: int, frame: object) -> None:
    """The handler of SIGINT and SIGTERM: record the signal, raise its stop."""
    _received.append(signum)
    raise _stop(signum)


def _stop(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def install() -> None:
    """Make :func:`on_signal` the handler of SIGINT and SIGTERM
    (:func:`fedsys_launch.commands.cli.set_up_process`), also where SIGINT came ignored from the
    parent (``cmd &`` in a shell without job control, a pytest-xdist worker): Python
    would then never raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def raise_if_stopped() -> None:
    """Raise the stop of the first signal received, if any, in the main thread only (where
    the handler raised it: under Flower's engine the ServerApp runs in a thread of its own
    and the engine's loop in the main thread takes the stop)."""
    if _received and threading.current_thread() is threading.main_thread():
        raise _stop(_received[0])


__all__ = ["Terminated", "install", "on_signal", "raise_if_stopped"]
