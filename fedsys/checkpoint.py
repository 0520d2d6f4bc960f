"""Atomic checkpoints: write to a temporary file, fsync, then rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (a crash leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`."""
    out: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return out


def rng_state() -> dict[str, Any]:
    """Global numpy and torch RNG states (fedsys uses seeded generators, but a
    user's code may not)."""
    return {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}  # noqa: NPY002


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` output."""
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
