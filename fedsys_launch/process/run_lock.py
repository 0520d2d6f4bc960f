"""One fedsys process per run directory.

Two runs of one directory at once (two ``fedsys run``/``fedsys resume``, two ``flwr run``
or ``fedsys deploy run`` submissions with the same ``name``, or one of each) would write
the same checkpoints and records, and the run's history would be lost.  Whoever runs a
directory holds an ``flock`` on its :data:`RUN_LOCK` file for as long as it runs: the
``fedsys`` command line around the simulation engine, and the ServerApp itself
(:func:`fedsys_launch.apps.server_app.run_experiment`), so that ``flwr run`` and a deployment are
covered too.  Within one process the lock is re-entrant: ``fedsys run`` holds it and the
ServerApp it starts in the same process runs on.  The lock ends with the process, however
it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fedsys.config import ConfigError

#: the file in a run directory whose lock says a fedsys process is running it
RUN_LOCK = ".fedsys.lock"
#: how to give a run another name, said in the refusal: ``fedsys``'s spelling by default
CLI_RENAME = "--set name=..."
#: the same for ``flwr run``
FLWR_RENAME = "--run-config \"name='...'\""

_held: dict[Path, int] = {}  # run directories this process holds, how many times
_guard = threading.Lock()


def busy(run_dir: Path, who: str, rename: str = CLI_RENAME) -> str:
    """The one line refusing a run of ``run_dir``, which ``who`` runs."""
    return (f"{run_dir} is being run by {who or 'another process'}; wait for it to end, or "
            f"give this run another name ({rename})")


def in_use(run_dir: Path) -> str | None:
    """Who runs ``run_dir`` now (the lock file's line), or None when nobody does (or this
    process does).  Takes nothing: a look before sending a run elsewhere."""
    lock = run_dir / RUN_LOCK
    if run_dir.resolve() in _held or not lock.exists():
        return None
    with lock.open("r") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "another process"
        except OSError:  # a file system without locks: nobody can be seen
            return None
        return None


#: how long a start waits for the lock before refusing: a look (:func:`in_use`,
#: ``reproduce.py --list``) holds it shared for an instant, a run for its whole length
PEEK_WAIT_S = 0.5


def _lock(f: IO[str]) -> bool:
    """Lock ``f`` exclusively; False when another process runs the directory.  A shared
    lock seen is waited out for :data:`PEEK_WAIT_S` (somebody looking, not running);
    a file system without locks lets the run go on, as before locks."""
    deadline = time.monotonic() + PEEK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        except OSError:
            return True


@contextlib.contextmanager
def holding(run_dir: Path, rename: str = CLI_RENAME) -> Iterator[None]:
    """``run_dir`` to this process alone for a ``with`` block.

    Parameters
    ----------
    run_dir
        The run directory (created if missing).
    rename
        How the user gives the run another name, for the refusal.

    Raises
    ------
    ConfigError
        Another process holds ``run_dir``; the message names it (its pid and since when).
    """
    key = run_dir.resolve()
    with _guard:
        depth = _held.get(key, 0)
        if depth:
            _held[key] = depth + 1
    if depth:  # this process runs it already (the CLI around its own ServerApp)
        try:
            yield
        finally:
            with _guard:
                _held[key] -= 1
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / RUN_LOCK).open("a+") as f:
        if not _lock(f):
            f.seek(0)
            raise ConfigError(busy(run_dir, f.read().strip(), rename)) from None
        f.seek(0)
        f.truncate()
        f.write(f"fedsys pid {os.getpid()} (since {time.strftime('%F %T')})\n")
        f.flush()
        with _guard:
            _held[key] = 1
        try:
            yield
        finally:
            with _guard:
                del _held[key]
