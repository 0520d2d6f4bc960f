"""The errors of a deployment: one that could not be started, found or used, and a
submission that ended before a run started."""

from __future__ import annotations

from fedsys.config import ConfigError


class DeployError(ConfigError):
    """A deployment could not be started, found or used (printed as ``error: ...``)."""


class RunNotStartedError(RuntimeError):
    """``flwr run`` ended before the SuperLink started a run (unreachable, refused, bad
    certificate): nothing ran, so there is nothing to resume."""
