"""The environment every Flower and Ray process fedsys starts gets (the caller's own
values win where it sets them): no telemetry, no runtime installs or update checks, Ray's
settings for a machine that may be starved or stopped by a signal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DEDUP_LOGS": "0",
    # Ray binds to the machine's address unless told it is not a cluster: keep it on
    # loopback (read when ray is first imported).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # a starved machine (a niced run beside other work) must not lose its own Ray cluster:
    # the raylet is on this machine, a real death ends the driver anyway (docs/development.md
    # "Why things are as they are", Ray's settings)
    "RAY_health_check_failure_threshold": "50",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "600",
    # a model passed inline to and from the actors, not through the object store: quicker up
    # to this size (docs/performance.md "Where a simulated client's time goes")
    "RAY_max_direct_call_object_size": str(4 << 20),
    # Ray's C++ failure handler would take SIGTERM (a stack dump, no word on resuming);
    # without it SIGTERM stops the run as Ctrl-C does (tests/integration/test_interrupt.py)
    "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1",
}


def deployment_env() -> dict[str, str]:
    """The environment of every Flower process of a deployment and of its ``flwr`` CLI:
    this process's, without its confinement policy (each component gets the one of its
    deployment), with :data:`FLWR_ENV` and this interpreter's directory first on ``PATH``."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("FEDSYS_ROOTS", "FEDSYS_PLUGINS", "FEDSYS_DENY")}
    return {**inherited, **FLWR_ENV, "PATH": path}
