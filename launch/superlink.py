"""``flower-superlink`` with a longer SQLite busy timeout.

Flower 1.41's SuperLink keeps its state (``--database FILE``) in SQLite with a
hard-coded ``busy_timeout`` of 5 s (``flwr.supercore.constant.SQLITE_PRAGMAS``).  Each
reply arrives as one write transaction per object (every array of the model is one)
plus one for the message, each taking the database's single write lock; with 10
SuperNodes replying at once on 2 cores the queue for that lock grew past 5 s, the
SuperLink answered ``500 database is locked``, and a SuperNode dropped the reply it was
pushing (Flower's SuperNode does not retry a 500): measured, 2 of 10 replies lost in a
round (``benchmarks/deploy_load.py``).  Waiting longer for the lock loses nothing, so
this entry point sets the busy timeout to ``FEDSYS_SQLITE_BUSY_TIMEOUT_MS`` (default
120000) and then runs Flower's own ``flower-superlink`` with the same arguments.  With it
10 nodes lost no reply; at 30 nodes on 2 cores the queue passes the SuperNodes' own 30 s
request timeout and some replies are still dropped, which the SuperLink then reports as
lost and the ServerApp asks for again (``transport-retries``, strategies/base.py).

It also gives the ServerApp the same start window as :mod:`launch.supernode` gives a
ClientApp (``FEDSYS_CLIENTAPP_START_S``, default 300 s instead of Flower's 30 s): a
``flwr-serverapp`` that has not checked in 30 s after its run's task was claimed is
otherwise started a second time beside the first, two ServerApps then driving one run.

Used by ``fedsys deploy`` (:mod:`launch.deploy`) as ``python -m launch.superlink``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta

from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL
from flwr.supercore import sql_mixin
from flwr.supercore.corestate.sql_corestate import SqlCoreState
from flwr.supercore.date import now
from flwr.supercore.state.schema.corestate_models import Task as TaskModel
from flwr.supercore.utils import uint64_to_int64
from flwr.superlink.cli import flower_superlink
from sqlalchemy import update

from launch.console import hand_over
from launch.supernode import env_positive, start_window_s

ENV = "FEDSYS_SQLITE_BUSY_TIMEOUT_MS"
DEFAULT_MS = 120_000
PRAGMAS = "SQLITE_PRAGMAS"  # read by flwr.supercore.sql_mixin on every new connection


def busy_timeout_ms(environ: Mapping[str, str] = os.environ) -> int:
    """The busy timeout to set, from ``FEDSYS_SQLITE_BUSY_TIMEOUT_MS`` (milliseconds,
    rounded to a whole number) or :data:`DEFAULT_MS`."""
    return max(1, round(env_positive(environ, ENV, DEFAULT_MS, "milliseconds")))


def with_busy_timeout(pragmas: tuple[tuple[str, str], ...],
                      ms: int) -> tuple[tuple[str, str], ...]:
    """``pragmas`` with ``busy_timeout`` set to ``ms``; it must be there already (the
    Flower release this was written for sets it), so a Flower that no longer does is
    refused instead of silently running with its own value."""
    if "busy_timeout" not in dict(pragmas):
        raise SystemExit("flwr.supercore.sql_mixin.SQLITE_PRAGMAS has no busy_timeout: "
                         "this Flower release is not the one launch/superlink.py knows")
    return tuple((k, str(ms) if k == "busy_timeout" else v) for k, v in pragmas)


def apply(ms: int) -> None:
    """Make every SQLite connection the SuperLink opens from now on wait ``ms`` for a
    lock (Flower sets its pragmas on each new connection)."""
    setattr(sql_mixin, PRAGMAS, with_busy_timeout(getattr(sql_mixin, PRAGMAS, ()), ms))


def with_start_window(claim: Callable[[SqlCoreState, int], str | None],
                      seconds: float) -> Callable[[SqlCoreState, int], str | None]:
    """``claim_task`` of the SuperLink's SQL state whose claimed task waits ``seconds``
    (at least Flower's own 30 s) for its app process to check in."""

    def claim_task(self: SqlCoreState, task_id: int) -> str | None:
        token = claim(self, task_id)
        if token is not None:
            until = now() + timedelta(seconds=max(seconds, HEARTBEAT_DEFAULT_INTERVAL))
            with self.session() as session:
                session.execute(update(TaskModel)
                                .where(TaskModel.task_id == uint64_to_int64(task_id),
                                       TaskModel.token == token)
                                .values(active_until=until))
        return token

    claim_task.__doc__ = claim.__doc__
    return claim_task


def apply_start_window(seconds: float) -> None:
    """Give every task the SuperLink hands out from now on ``seconds`` to start."""
    SqlCoreState.claim_task = with_start_window(  # type: ignore[method-assign,assignment]
        SqlCoreState.claim_task, seconds)


def main() -> None:
    """Set the busy timeout and the start window, then hand over to Flower's
    ``flower-superlink``."""
    apply(busy_timeout_ms())
    apply_start_window(start_window_s())
    hand_over("flower-superlink", flower_superlink)


if __name__ == "__main__":
    main()
