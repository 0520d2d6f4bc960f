"""Atomic checkpoints with the previous good one kept beside the latest, read without
running code.

:func:`save` writes to a temporary file, fsyncs, moves the current checkpoint to
``<name>.prev.pt`` and renames the new one into place, so a crash at any moment leaves
a readable checkpoint.  :func:`load` names the file and the problem when it cannot be
read (truncated, corrupt, or written by a fedsys whose checkpoint format this one does
not read); :func:`load_latest` falls back to the previous checkpoint and says so.  A bit
flipped since the write is corrupt too: ``torch.save`` writes a zip archive whose every
part carries a CRC-32, which ``torch.load`` does not check and :func:`load` does.

What is read is checked too.  A checkpoint is a pickle, and the paths it is read from
come from the run config (``branch-from``, ``resume``): a file whose pickle names a
callable (an object whose ``__reduce__`` returns ``os.system``) would run it when read by
``torch.load(weights_only=False)``.  So :func:`load` reads with ``weights_only=True``,
which builds only plain values, tensors and the :data:`SAFE_GLOBALS` allowed for that
one load (numpy arrays: a model's weights, FedCDA's cache, the numpy RNG state), and
never a file that is not the zip archive ``torch.save`` writes.  Anything else is
refused before any of it runs, with the names it would have imported
(:class:`UnsafeCheckpointError`).  :func:`save` checks the other side: it refuses to
write a value :func:`load` would refuse (:func:`foreign`), so a checkpoint that a run
writes is one it can resume from.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

#: The checkpoint layout this fedsys writes, and the only one :func:`load` reads.
FORMAT = 2

#: numpy's ``_reconstruct``, which a pickled ``ndarray`` names first (its module is
#: ``numpy._core.multiarray`` in numpy 2, ``numpy.core.multiarray`` in numpy 1).
_RECONSTRUCT = cast("Callable[..., Any]", np.empty(0).__reduce__()[0])

#: The numpy dtypes a checkpoint's arrays have: numbers (kinds ``b``, ``i``, ``u``,
#: ``f``, ``c``; :func:`foreign`).  Weights are ``float32`` (``int64`` for a batch
#: norm's counter), FedCDA's and FedOpt's sums ``float64``, the numpy RNG state
#: ``uint32``; a model of other numeric dtypes is checkpointed as well.
NUMERIC_DTYPES = "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]

#: What :func:`load` allows ``torch.load(weights_only=True)`` to build beyond plain
#: values and tensors, for that one load only: exactly what a numpy array pickles into.
#: ``_reconstruct(ndarray, shape, dtype)`` makes an empty array, ``np.dtype(code, ...)``
#: its dtype, whose state is then set on that dtype's class (``Float32DType``, ...: one
#: per :data:`NUMERIC_DTYPES`, so no object, string or structured dtype is built), and
#: ``ndarray.__setstate__`` fills the array from raw bytes.  Arrays are a model's weights
#: (``Params``), FedOpt's moments, FedCDA's cache and sums, and the numpy RNG state
#: (``np.random.get_state()``: a tuple holding a ``uint32`` array); nothing else in a
#: checkpoint needs a global.
SAFE_GLOBALS: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
    (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"),   # written under numpy 1
    (_RECONSTRUCT, "numpy._core.multiarray._reconstruct"),  # written under numpy 2
    np.ndarray,
    np.dtype,
    *sorted({type(np.dtype(c)) for c in NUMERIC_DTYPES}, key=lambda t: t.__name__),
]

#: The values a checkpoint holds besides dicts, lists, tuples, tensors and numeric numpy
#: arrays (their exact types: a subclass such as ``numpy.float64`` pickles as a global).
PLAIN: tuple[type, ...] = (type(None), bool, int, float, str, bytes)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with the file and the reason."""


class UnsafeCheckpointError(CheckpointError):
    """A file that holds more than a checkpoint does (code, or objects): refused unread,
    and never replaced by the previous checkpoint."""


def version() -> str:
    """This fedsys's version."""
    try:
        return metadata.version("fedsys")
    except metadata.PackageNotFoundError:
        return "unknown"


def prev_path(path: Path) -> Path:
    """Where :func:`save` keeps the previous checkpoint (``checkpoint.prev.pt``)."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def foreign(obj: Any, where: str = "checkpoint") -> str | None:
    """Where in ``obj`` a value lies that :func:`load` would refuse, and what it is.

    Parameters
    ----------
    obj
        What :func:`save` is asked to write (or a part of it).
    where
        How ``obj`` is named in the answer (its path from the payload's top).

    Returns
    -------
    str or None
        ``"checkpoint['strategy']['x']: a numpy.float64"`` for the first value that is
        not one of :data:`PLAIN`, a ``dict``, ``list`` or ``tuple`` of such values, a
        ``torch.Tensor`` or a numpy array of numbers; ``None`` when there is none.
    """
    kind = type(obj)
    if kind in PLAIN or kind is torch.Tensor:
        return None
    if kind is np.ndarray:
        return (None if obj.dtype.char in NUMERIC_DTYPES
                else f"{where}: an array of dtype {obj.dtype}")
    if kind in (list, tuple):
        return next((f for i, v in enumerate(obj) if (f := foreign(v, f"{where}[{i}]"))), None)
    if kind is dict:
        return next((f for k, v in obj.items()
                     if (f := foreign(k, f"{where} key {k!r}") or foreign(v, f"{where}[{k!r}]"))),
                    None)
    return f"{where}: a {kind.__module__}.{kind.__qualname__}"


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, keeping the one it replaces as
    :func:`prev_path` (a crash leaves the old file, or the previous one).

    Raises
    ------
    TypeError
        ``payload`` holds a value :func:`load` would refuse (:func:`foreign`); nothing
        is written.
    """
    if where := foreign(payload):
        raise TypeError(f"cannot write {path}: {where}, which a checkpoint does not hold "
                        "(plain values, dicts, lists, tuples, tensors and numeric numpy "
                        "arrays only: fedsys.checkpoint reads no other objects)")
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
    """Read a checkpoint written by :func:`save`, running none of its content.

    Raises
    ------
    UnsafeCheckpointError
        The file holds Python code or objects a checkpoint does not (the names it
        would import are given).
    CheckpointError
        The file is missing, truncated, corrupt, no fedsys checkpoint, or of a format
        this fedsys does not read.
    """
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if not zipfile.is_zipfile(path):
        if names := pickle_imports(path):
            raise refusal(path, names)
        raise CheckpointError(f"{path} is truncated or corrupt (not the zip archive "
                              "torch.save writes)")
    if part := changed_part(path):
        raise CheckpointError(f"{path} is corrupt (its part {part!r} fails the CRC-32 it was "
                              "written with)")
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            out: Any = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # what the safe loader refuses (its CRC-32s held)
        raise refusal(path, pickle_imports(path)) from None
    except Exception as exc:
        raise CheckpointError(f"{path} is truncated or corrupt ({type(exc).__name__})") from None
    if not isinstance(out, dict) or "round" not in out:
        raise CheckpointError(f"{path} is not a fedsys checkpoint")
    fmt = out.get("format", "none")
    if fmt != FORMAT:
        raise CheckpointError(
            f"{path} was written by fedsys {out.get('fedsys', '?')} (checkpoint format {fmt}); "
            f"this fedsys {version()} reads format {FORMAT}")
    return out


def refusal(path: Path, names: Iterable[str]) -> UnsafeCheckpointError:
    """The one-line error for a file :func:`load` refuses, naming what it would import
    (``names``)."""
    found = sorted(set(names))
    listed = ", ".join(found) or "pickle instructions the safe loader does not run"
    return UnsafeCheckpointError(
        f"{path} holds Python code or objects a checkpoint does not ({listed}): refused "
        "unread (fedsys did not write it so, or it was changed since)")


def pickle_imports(path: Path) -> list[str]:
    """What the pickle in ``path`` would import that ``torch.load(weights_only=True)``
    with :data:`SAFE_GLOBALS` does not allow, read without running any of it.

    In a ``torch.save`` archive: the globals torch does not allow
    (``torch.serialization.get_unsafe_globals_in_checkpoint``) and any import by an
    opcode the safe loader never runs; in any other file, every import of the pickle
    it starts with.  Empty when the file holds none, or is no pickle.
    """
    try:
        if zipfile.is_zipfile(path):
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            with zipfile.ZipFile(path) as z:
                data = next(n for n in z.namelist() if n.endswith("data.pkl"))
                with z.open(data) as fh:
                    _, other = scan_imports(fh)
            return sorted(unsafe | other)
        with path.open("rb") as fh:
            by_global, other = scan_imports(fh)
        return sorted(by_global | other)
    except Exception:  # unreadable: the caller says what it can
        return []


def scan_imports(fh: IO[bytes]) -> tuple[set[str], set[str]]:
    """The ``module.name`` imports of the pickle read from ``fh``, by :mod:`pickletools`
    (which decodes opcodes and runs nothing).

    Returns
    -------
    tuple of set
        Those by ``GLOBAL`` (the one import opcode torch's safe loader takes, and only
        of allowed names), and those by ``STACK_GLOBAL`` or ``INST`` (which it never
        takes; a name built on the stack shows as far as it can be followed).  The scan
        stops quietly at the first byte that is no pickle.
    """
    by_global: set[str] = set()
    other: set[str] = set()
    strings: list[str] = []                # strings pushed, for STACK_GLOBAL
    memo: dict[int, str | None] = {}
    last: str | None = None
    try:
        for op, arg, _ in pickletools.genops(fh):
            pushed: str | None = None
            if op.name == "GLOBAL":
                by_global.add(str(arg).replace(" ", "."))
            elif op.name == "INST":
                other.add(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                other.add(".".join(strings[-2:]) if len(strings) >= 2 else "?")
            elif op.name == "MEMOIZE":
                memo[len(memo)] = last
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int):
                memo[arg] = last
            elif op.name in ("GET", "BINGET", "LONG_BINGET") and isinstance(arg, int):
                pushed = memo.get(arg)
            elif isinstance(arg, str):
                pushed = arg
            if pushed is not None:
                strings.append(pushed)
            if op.name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                last = pushed
    except Exception:  # the end of what is a pickle
        pass
    return by_global, other


def changed_part(path: Path) -> str | None:
    """The first part of a zip-format checkpoint whose bytes fail the CRC-32 written with
    them (``None``: all hold, or the file is no zip archive)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip()
    except Exception:  # a truncated or foreign file: its reader names it
        return None


def load_latest(path: Path) -> tuple[dict[str, Any], Path, str]:
    """The newest usable checkpoint: ``path``, else its previous one.

    Returns the checkpoint, the file it came from and a note when it fell back (empty
    otherwise).  Raises :class:`CheckpointError` when neither can be used, saying the
    strategy cannot be resumed; an :class:`UnsafeCheckpointError` for ``path`` is
    raised as it is (a file replaced by another is not worked around in silence).
    """
    try:
        return load(path), path, ""
    except UnsafeCheckpointError:
        raise
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


__all__ = ["FORMAT", "NUMERIC_DTYPES", "PLAIN", "SAFE_GLOBALS", "CheckpointError",
           "UnsafeCheckpointError", "changed_part", "foreign", "load", "load_latest",
           "pickle_imports", "prev_path", "refusal", "rng_state", "save", "scan_imports",
           "set_rng_state", "version"]
