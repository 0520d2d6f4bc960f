"""Atomic checkpoints with the previous good one kept beside the latest.

:func:`save` writes to a temporary file, fsyncs, moves the current checkpoint to
``<name>.prev.pt`` and renames the new one into place, so a crash at any moment leaves
a readable checkpoint.  :func:`load` names the file and the problem when it cannot be
read (truncated, corrupt, or written by a fedsys whose checkpoint format this one does
not read); :func:`load_latest` falls back to the previous checkpoint and says so.  A bit
flipped since the write is corrupt too: ``torch.save`` writes a zip archive whose every
part carries a CRC-32, which ``torch.load`` does not check and :func:`load` does.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The checkpoint layout this fedsys writes and reads (checkpoints without a format
#: field were written before it existed and have this layout).
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with the file and the reason."""


def version() -> str:
    """This fedsys's version."""
    try:
        return metadata.version("fedsys")
    except metadata.PackageNotFoundError:
        return "unknown"


def prev_path(path: Path) -> Path:
    """Where :func:`save` keeps the previous checkpoint (``checkpoint.prev.pt``)."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, keeping the one it replaces as
    :func:`prev_path` (a crash leaves the old file, or the previous one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({**payload, "format": FORMAT, "fedsys": version()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            os.replace(path, prev_path(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; :class:`CheckpointError` names the
    file when it is missing, truncated, corrupt or of another format."""
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if part := changed_part(path):
        raise CheckpointError(f"{path} is corrupt (its part {part!r} fails the CRC-32 it was "
                              "written with)")
    try:
        out: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"{path} is truncated or corrupt ({type(exc).__name__})") from None
    if not isinstance(out, dict) or "round" not in out:
        raise CheckpointError(f"{path} is not a fedsys checkpoint")
    fmt = out.get("format", FORMAT)
    if fmt != FORMAT:
        raise CheckpointError(
            f"{path} was written by fedsys {out.get('fedsys', '?')} (checkpoint format {fmt}); "
            f"this fedsys {version()} reads format {FORMAT}")
    return out


def changed_part(path: Path) -> str | None:
    """The first part of a zip-format checkpoint whose bytes fail the CRC-32 written with
    them (``None``: all hold, or the file is no zip archive, left to ``torch.load``)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip()
    except Exception:  # a truncated or foreign file: torch.load names it
        return None


def load_latest(path: Path) -> tuple[dict[str, Any], Path, str]:
    """The newest usable checkpoint: ``path``, else its previous one.

    Returns the checkpoint, the file it came from and a note when it fell back (empty
    otherwise).  Raises :class:`CheckpointError` when neither can be used, saying the
    strategy cannot be resumed.
    """
    try:
        return load(path), path, ""
    except CheckpointError as exc:
        prev = prev_path(path)
        if not prev.exists():
            raise CheckpointError(f"{exc}, and there is no previous checkpoint: this strategy "
                                  "cannot be resumed; start the run again") from None
        try:
            ckpt = load(prev)
        except CheckpointError as exc2:
            raise CheckpointError(f"{exc}, and {exc2}: this strategy cannot be resumed; start "
                                  "the run again") from None
        return ckpt, prev, (f"{exc}; resuming from the previous checkpoint {prev.name} "
                            f"(round {ckpt['round']})")


def rng_state() -> dict[str, Any]:
    """Global numpy and torch RNG states (fedsys uses seeded generators, but a
    user's code may not)."""
    return {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}  # noqa: NPY002


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` output."""
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])


__all__ = ["FORMAT", "CheckpointError", "load", "load_latest", "prev_path", "rng_state",
           "save", "set_rng_state", "version"]
