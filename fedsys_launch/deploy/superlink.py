"""``flower-superlink`` with a longer SQLite busy timeout.

Flower 1.41's SuperLink keeps its state (``--database FILE``) in SQLite with a
hard-coded ``busy_timeout`` of 5 s (``flwr.supercore.constant.SQLITE_PRAGMAS``).  Each
reply arrives as one write transaction per object plus one for the message, each taking
the database's single write lock; when many SuperNodes reply at once the queue for that
lock passes 5 s, the SuperLink answers ``500 database is locked``, and the SuperNode
drops the reply it was pushing (it does not retry a 500; figures: docs/performance.md
"What each patch of Flower buys").  Waiting longer for the lock loses nothing, so this
entry point sets the busy timeout to ``FEDSYS_SQLITE_BUSY_TIMEOUT_MS`` (default 120000)
and then runs Flower's own ``flower-superlink`` with the same arguments.  A reply still
dropped past the SuperNodes' own 30 s request timeout is reported lost and asked for
again (``transport-retries``, strategies/base.py).

It also gives the ServerApp the same start window as :mod:`fedsys_launch.deploy.supernode` gives a
ClientApp (``FEDSYS_CLIENTAPP_START_S``, default 300 s instead of Flower's 30 s): a
``flwr-serverapp`` that has not checked in 30 s after its run's task was claimed is
otherwise started a second time beside the first, two ServerApps then driving one run.

And it closes what the threat model needs closed (docs/deployment.md): the ServerApp's
Runtime calls signed with its task's key (``signed-task-calls``), a node served only the
messages and objects handed to it (``fleet-ownership``), and nodes' request signatures
bound to the request and good once (``bound-node-signatures``).

These are patches of Flower's own code, in :mod:`fedsys_launch.flower_patches`: a Flower
release the first two do not fit keeps its own behaviour, with a WARNING; one the security
patches do not fit stops the SuperLink.  Used by ``fedsys deploy`` (:mod:`fedsys_launch.deploy.local_deployment`)
as ``python -m fedsys_launch.deploy.superlink``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from flwr.superlink.cli import flower_superlink

from fedsys_launch import flower_patches
from fedsys_launch.deploy.supernode import env_positive, start_window_s
from fedsys_launch.process.console import hand_over

ENV = "FEDSYS_SQLITE_BUSY_TIMEOUT_MS"
DEFAULT_MS = 120_000


def busy_timeout_ms(environ: Mapping[str, str] = os.environ) -> int:
    """The busy timeout to set, from ``FEDSYS_SQLITE_BUSY_TIMEOUT_MS`` (milliseconds,
    rounded to a whole number) or :data:`DEFAULT_MS`."""
    return max(1, round(env_positive(environ, ENV, DEFAULT_MS, "milliseconds")))


def main() -> None:
    """Set the busy timeout and the start window, then hand over to Flower's
    ``flower-superlink``."""
    flower_patches.sqlite_busy_timeout(busy_timeout_ms())
    flower_patches.superlink_start_window(start_window_s())
    flower_patches.signed_task_calls()
    flower_patches.fleet_ownership()
    flower_patches.bound_node_signatures()
    hand_over("flower-superlink", flower_superlink)


if __name__ == "__main__":
    main()
