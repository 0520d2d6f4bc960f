"""Colours only where a person watches.

Flower's console handler colours every log level with ANSI escape codes, Ray passes its
workers' (equally coloured) output through, and both land verbatim in a file or a pipe
(``fedsys run ... > log``, ``| tee``, CI logs).  :func:`plain_when_redirected` makes a
stream that is not a terminal carry plain text: Flower's handler stops colouring, and
whatever else writes escape codes through ``sys.stdout``/``sys.stderr`` (Ray's log
monitor, a library) has them removed on the way.  A terminal keeps its colours.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import IO, Any

#: An ANSI CSI escape sequence (colours, cursor moves): ESC [ parameters intermediates final.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return ANSI.sub("", text)


class Uncoloured:
    """A text stream that writes to ``stream`` with ANSI escape sequences removed and
    says it is not a terminal (so rich and Ray do not colour it either)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` without its escape sequences; return ``len(text)``."""
        self.stream.write(strip_ansi(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Write every line of ``lines`` as :meth:`write` does."""
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        """Never a terminal."""
        return False

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, ...
        return getattr(self.stream, name)


def plain_when_redirected() -> None:
    """For ``sys.stdout`` and ``sys.stderr`` that are not terminals: strip escape codes
    from everything written to them, and stop Flower's console handler colouring."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, Uncoloured) or stream.isatty():
            continue
        plain = Uncoloured(stream)
        setattr(sys, name, plain)
        for handler in logging.getLogger("flwr").handlers:
            if (isinstance(handler, logging.StreamHandler)
                    and not isinstance(handler, logging.FileHandler)
                    and handler.stream is stream):
                handler.setStream(plain)
                if hasattr(handler, "colored"):
                    handler.colored = False
        if name == "stdout":
            os.environ.setdefault("NO_COLOR", "1")  # what rich and other libraries honour


def hand_over(command: str, entry: Callable[[], None]) -> None:
    """Run a Flower command's entry point (``flower-superlink``, ``flower-supernode``)
    as ``command``, its output plain where it is redirected (a deployment's log file),
    under umask 077: what a Flower component and the apps it starts write (the SuperLink's
    database, logs, checkpoints and results) is its own user's alone, in the images too."""
    os.umask(0o077)
    plain_when_redirected()
    sys.argv[0] = command
    entry()
