"""How a fedsys ClientApp admits each message's run config (:func:`fedsys.confine.admit`),
and what it keeps of the configs it admitted (:class:`Admission`).

Two memos: the app's own, the last config admitted (every node of a round brings the same
run config), and the process's (:func:`built_config`, :func:`admitted_under`), which
outlives the app: Flower's simulation engine hands its Ray actors the app anew, unpickled,
with every message, whose own memo then starts empty.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from fedsys import confine
from fedsys.config import RunConfig
from fedsys_launch.config_schema import from_run_config


@functools.lru_cache(maxsize=4)
def built_config(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    """The config of the run-config ``items`` (sorted pairs), built once per process."""
    return from_run_config(dict(items))


def admit(run_config: Mapping[str, Any], policy: confine.Policy, node_data_dir: str | None,
          build: Callable[[Mapping[str, Any]], RunConfig]) -> RunConfig:
    """``run_config`` admitted under ``policy`` (the node's ``data-dir`` allowed), built by
    ``build``."""
    if node_data_dir is not None:
        policy = policy.reading(node_data_dir)
    return confine.admit(run_config, policy, build, confine.CLIENT_KEYS)


@functools.lru_cache(maxsize=4)
def admitted_under(policy: confine.Policy, items: tuple[tuple[str, Any], ...],
                   node_data_dir: str | None) -> RunConfig:
    """``items`` admitted under a fixed ``policy``: checked once per process (Flower's
    simulation engine hands its actors the app anew with every message)."""
    return admit(dict(items), policy, node_data_dir, lambda _: built_config(items))


class Admission:
    """How a fedsys ClientApp admits each message's run config (:func:`fedsys.confine.admit`):
    under ``policy``, or, where it is None, the site operator's policy read from the
    environment at every message (:func:`fedsys.confine.policy_from_env`).

    The last config admitted is kept (every node of a round brings the same run config):
    built once, and under a fixed ``policy`` checked once.
    """

    def __init__(self, policy: confine.Policy | None = None) -> None:
        self.policy = policy
        #: the last run config admitted: the dict, the node's data-dir and its RunConfig
        self._last: tuple[dict[str, Any], str | None, RunConfig] | None = None

    def __call__(self, run_config: dict[str, Any], node_data_dir: str | None) -> RunConfig:
        """The config of ``run_config`` (the node's ``data-dir`` already in it), admitted.

        Raises
        ------
        ConfigError
            A key the policy refuses, named (the node's ``data-dir`` is allowed).
        """
        last = self._last  # one read: another thread may set it meanwhile
        if self.policy is not None:
            if last is not None and last[1] == node_data_dir and last[0] == run_config:
                return last[2]  # a dict compare, no sorting, for every node
            cfg = admitted_under(self.policy, tuple(sorted(run_config.items())), node_data_dir)
        else:
            def build(rc: Mapping[str, Any]) -> RunConfig:
                if last is not None and last[0] == rc:
                    return last[2]
                return built_config(tuple(sorted(rc.items())))

            cfg = admit(run_config, confine.policy_from_env(os.environ), node_data_dir, build)
        self._last = (dict(run_config), node_data_dir, cfg)
        return cfg
