"""``flower-supernode`` with a longer window for a ClientApp to start.

In Flower 1.41 the SuperNode hands each message to its SuperExec as a task; the
SuperExec claims it and starts a ``flwr-clientapp`` process, which must check in
(activate the task) within ``HEARTBEAT_DEFAULT_INTERVAL`` = 30 s of the claim.  A task
not activated by then goes back to pending (``InMemoryCoreState.
_cleanup_expired_task_tokens_locked``), the SuperExec claims it again and starts a
second ClientApp, and the first one is left running.  A ClientApp that needs longer
than 30 s to import torch and Flower (many nodes on few cores, or a machine busy with
something else) so starts another and another, each slowing the others further until
memory runs out (docs/performance.md "Deployment load"), and a node caught in this never
replies again (its SuperNode waits for the reply of the task it handed out).

This entry point widens only that start window, to ``FEDSYS_CLIENTAPP_START_S``
seconds (default 300): a claimed task waits that long for its ClientApp, so there is
one ClientApp per message.  The heartbeats of a running ClientApp keep Flower's
timing (a crashed ClientApp is still noticed after two missed 30 s heartbeats); only a
ClientApp that dies before it checks in now holds its message for the whole window
instead of 30 s.  Then it runs Flower's own ``flower-supernode`` with the same
arguments.

The change is a patch of Flower's own code, in :mod:`fedsys_launch.flower_patches`
(``supernode-start-window``): a Flower release it does not fit keeps its own window, with a
WARNING.  Used by ``fedsys deploy`` (:mod:`fedsys_launch.deploy.local_deployment`) as ``python -m fedsys_launch.deploy.supernode``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from flwr.supernode.cli import flower_supernode

from fedsys_launch import flower_patches
from fedsys_launch.process.console import hand_over

ENV = "FEDSYS_CLIENTAPP_START_S"
DEFAULT_S = 300.0


def env_positive(environ: Mapping[str, str], name: str, default: float, unit: str) -> float:
    """A positive, finite number from the environment variable ``name``, or ``default``
    when it is unset or empty; anything else stops the process naming the variable."""
    text = environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise SystemExit(f"{name}={text!r}: give a positive number of {unit}")
    return value


def start_window_s(environ: Mapping[str, str] = os.environ) -> float:
    """The start window to set, from ``FEDSYS_CLIENTAPP_START_S`` (seconds) or
    :data:`DEFAULT_S`."""
    return env_positive(environ, ENV, DEFAULT_S, "seconds")


def task_lease_s(environ: Mapping[str, str] = os.environ) -> float:
    """The longest a message's task may hold the node, from ``FEDSYS_TASK_LEASE_S``
    (seconds) or :data:`fedsys_launch.flower_patches.LEASE_S`."""
    return env_positive(environ, flower_patches.LEASE_ENV, flower_patches.LEASE_S, "seconds")


def main() -> None:
    """Set the start window, the task lease and the signatures of the node's requests and
    of its ClientApps' Runtime calls, then hand over to Flower's ``flower-supernode``."""
    flower_patches.supernode_start_window(start_window_s())
    flower_patches.task_lease(task_lease_s())
    flower_patches.signed_task_calls()
    flower_patches.sign_node_requests()
    hand_over("flower-supernode", flower_supernode)


if __name__ == "__main__":
    main()
