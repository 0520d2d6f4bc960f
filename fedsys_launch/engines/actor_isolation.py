"""What a Ray actor keeps to itself, kept apart for a ClientApp called in the ServerApp's
process (:mod:`fedsys_launch.engines.inprocess`): copies of the messages and records that cross (as Ray's
pickling makes them), the clients' torch thread count and global random generators
(:class:`ClientSide`).  Flower's task identity of the caller is a patch of Flower's
(:func:`fedsys_launch.flower_patches.task_identity`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Message, RecordDict
from flwr.app.message import make_message

#: torch's default seed: the global generator of a fresh process, as a Ray actor starts.
TORCH_DEFAULT_SEED = 67280421310721
#: Seeds the clients' global NumPy and ``random`` generators (a fresh Ray actor's come from
#: the OS): fedsys's clients seed their own, so none of its numbers depend on these.
CLIENT_RNG_SEED = 0xC11E


def actor_threads(client_num_cpus: float, environ: Mapping[str, str]) -> int:
    """torch's thread count in a fresh Ray actor: ``OMP_NUM_THREADS`` where set, else the
    actor's CPUs rounded down, at least 1 (Ray sets ``OMP_NUM_THREADS`` so)."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(math.floor(client_num_cpus), 1)


def copy_records(records: RecordDict) -> RecordDict:
    """A copy of ``records`` that can change without changing them: new records, lists
    copied; the :class:`~flwr.app.Array` objects (immutable bytes) shared."""
    out = RecordDict()
    for key, record in records.items():
        new = record.copy()
        for k, v in list(new.items()):
            if isinstance(v, list):
                new[k] = list(v)  # type: ignore[assignment]
        out[key] = new
    return out


def copy_message(msg: Message) -> Message:
    """``msg`` as the other side receives it: its own metadata and records (as Ray's
    pickling gives a Ray actor and the server), the arrays shared."""
    meta = copy.copy(msg.metadata)
    delivered = msg.metadata.delivered_at
    out = (make_message(meta, content=copy_records(msg.content)) if msg.has_content()
           else make_message(meta, error=copy.copy(msg.error)))
    out.metadata.delivered_at = delivered  # the constructor clears it
    return out


@dataclass
class ProcessState:
    """What a ClientApp can change for its whole process: torch's intra-op threads and the
    global generators of ``random``, NumPy, torch (and CUDA, once in use)."""

    threads: int
    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor] | None = None

    @classmethod
    def capture(cls) -> ProcessState:
        """This process's, now."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(torch.get_num_threads(), random.getstate(),
                   np.random.get_state(), torch.get_rng_state(), cuda)  # noqa: NPY002

    @classmethod
    def fresh(cls, threads: int, seed: int = CLIENT_RNG_SEED) -> ProcessState:
        """A new process's (a Ray actor's): torch at its default seed, ``random`` and
        NumPy seeded from ``seed``."""
        return cls(threads, random.Random(seed).getstate(),
                   np.random.RandomState(seed).get_state(),
                   torch.Generator().manual_seed(TORCH_DEFAULT_SEED).get_state())

    def apply(self) -> None:
        """Make it this process's."""
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        random.setstate(self.python)
        np.random.set_state(self.numpy)  # noqa: NPY002
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None and torch.cuda.is_initialized():
            torch.cuda.set_rng_state_all(self.cuda)


class ClientSide:
    """The clients' process state (:class:`ProcessState`), kept apart from the ServerApp's
    as a Ray actor's is: :meth:`entered` swaps it in for a ClientApp call, and back out."""

    def __init__(self, threads: int) -> None:
        self.state = ProcessState.fresh(threads)
        self.inside = False

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The clients' state in place (and gradients on, as in a fresh process); within
        an :meth:`entered` already, nothing more (the clients' state is in place)."""
        if self.inside:
            with torch.enable_grad():
                yield
            return
        server = ProcessState.capture()
        self.state.apply()
        self.inside = True
        try:
            with torch.enable_grad():
                yield
        finally:
            self.inside = False
            self.state = ProcessState.capture()
            server.apply()


__all__ = ["CLIENT_RNG_SEED", "TORCH_DEFAULT_SEED", "ClientSide", "ProcessState", "actor_threads",
           "copy_message", "copy_records"]
