"""One ``ast.parse`` at a time, on the CPython versions where two at once can fail.

CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 keep the AST constructor's recursion counter in
state shared by all threads (gh-106905, fixed by GH-113035 in 3.11.8 and 3.12.2): when a
garbage collection during one thread's ``ast.parse`` lets another thread parse, one of them
fails with ``SystemError: AST constructor recursion depth mismatch``.  Flower's simulation
loads a ServerApp and a ClientApp named by reference in two threads, and checks each by
parsing its module (``flwr.supercore.object_ref.validate``), so a run started that way can
fail before its first round; one of our CI runs did, on 3.11.7.  The bug is the
interpreter's, not fedsys's or Flower's, and the README tells users to take 3.11.8 or later.

The test suite runs on whatever Python the machine has: ``tests/conftest.py`` calls
:func:`guard` in each test process, and the processes Flower's local SuperLink starts get
this directory on ``PYTHONPATH``, where Python imports this file at start-up.
"""

from __future__ import annotations

import ast
import functools
import sys
import threading

AFFECTED = (3, 11) <= sys.version_info[:3] < (3, 11, 8) or (3, 12) <= sys.version_info[:3] < (3, 12, 2)


def guard() -> bool:
    """Serialize ``ast.parse`` where the interpreter is affected; return whether it was."""
    if not AFFECTED or getattr(ast.parse, "__wrapped__", None) is not None:
        return AFFECTED
    lock = threading.RLock()
    parse = ast.parse

    @functools.wraps(parse)
    def serialized(*args, **kwargs):  # type: ignore[no-untyped-def]
        with lock:
            return parse(*args, **kwargs)

    ast.parse = serialized  # type: ignore[assignment]
    return True


guard()
