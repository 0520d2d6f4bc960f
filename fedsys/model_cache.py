"""Per-client caches of recent local models (FedCDA's memory W_t^n), in RAM or on disk.

Each client keeps its K most recent models as flat vectors (see
:class:`fedsys.fedcda.Layout`) with the scalars FedCDA needs: the loss the client
reported, the squared norm of the trainable part and the round.  Adding the K+1-th
model drops the oldest (Alg. 1 line 8).

The disk cache writes one ``.npy`` file per cached model under its directory
(atomically) and maps files back with ``mmap_mode="r"`` only when a model is read,
so RAM holds metadata only, whatever the number of clients.  Files are never
rewritten in place: a checkpoint refers to files by name.  A model dropped from the
cache loses its file at once unless one of the two kept checkpoints (latest and
previous) refers to it; those files go once the next checkpoint is on disk
(:meth:`ModelCache.collect`), so a run killed at any moment resumes exactly, and a
strategy driven without checkpoints keeps exactly the files of its live models.  Each
file's data bytes carry a CRC-32 in the cache's state, checked on restore and on a file's
first read in each pass (a FedCDA round): a file changed after it was written (a flipped bit
included) is named, not read.
"""

from __future__ import annotations

import os
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params

Vec = NDArray[np.floating]


class CacheFileError(ValueError):
    """A model file of the disk store is missing, truncated, changed or not an array file."""


def _changed(path: Path, now: int, written: int) -> str:
    """The line naming a cache file whose data bytes no longer have their CRC-32."""
    return f"{path.name} has changed since it was written (CRC-32 {now:08x}, written {written:08x})"


@dataclass
class Entry:
    """One cached local model (its vector lives in the cache's store)."""

    round: int
    loss: float
    sq: float
    ints: Params = field(default_factory=dict)
    #: CRC-32 of the disk store's data bytes (``None``: RAM store)
    crc: int | None = None


class ModelCache:
    """Up to ``capacity`` recent models per client, stored in RAM or in ``directory``.

    Parameters
    ----------
    capacity : int
        K, models kept per client.
    directory : Path or None
        Where the disk store writes its files; ``None`` keeps vectors in RAM.
    """

    def __init__(self, capacity: int, directory: Path | None = None) -> None:
        if capacity < 1:
            raise ValueError("cache capacity must be at least 1")
        self.capacity = capacity
        self.directory = directory
        self.entries: dict[int, deque[Entry]] = {}
        self._ram: dict[tuple[int, int], Vec] = {}
        # files the latest and the previous checkpoint refer to (see collect)
        self._kept_before: set[str] = set()
        self._kept_prev: set[str] = set()
        # disk files whose data bytes were checked against their CRC-32 since new_pass()
        self._verified: set[str] = set()
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------- access

    @property
    def on_disk(self) -> bool:
        return self.directory is not None

    def clients(self) -> list[int]:
        """Clients with at least one cached model, sorted."""
        return sorted(c for c, q in self.entries.items() if q)

    def of(self, client: int) -> list[Entry]:
        """The client's cached entries, oldest first."""
        return list(self.entries.get(client, ()))

    def entry(self, client: int, rnd: int) -> Entry:
        """The entry of ``client`` from round ``rnd``."""
        for e in self.entries.get(client, ()):
            if e.round == rnd:
                return e
        raise KeyError(f"client {client} has no cached model from round {rnd}")

    def _path(self, client: int, rnd: int) -> Path:
        assert self.directory is not None
        return self.directory / f"c{client:06d}-r{rnd:06d}.npy"

    def vector(self, client: int, rnd: int) -> Vec:
        """The cached vector (a read-only memory map for the disk store).

        The disk store checks a file's data bytes against the CRC-32 they were written
        with on the file's first read since :meth:`new_pass`: a file changed on disk,
        gone or cut short raises :class:`CacheFileError` naming it instead of entering
        the aggregate."""
        if self.directory is None:
            return self._ram[(client, rnd)]
        path = self._path(client, rnd)
        try:
            arr: Vec = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise CacheFileError(f"the FedCDA disk cache file {path} is missing") from None
        except (OSError, ValueError) as exc:  # truncated, or not an array file
            raise CacheFileError(f"the FedCDA disk cache file {path} cannot be read ({exc})") from None
        if path.name not in self._verified:
            crc = self.entry(client, rnd).crc
            if crc is not None and (now := zlib.crc32(arr.data)) != crc:
                raise CacheFileError(f"the FedCDA disk cache {self.directory}: "
                                     f"{_changed(path, now, crc)}; it is not read")
            self._verified.add(path.name)
        return arr

    def new_pass(self) -> None:
        """Start a pass over the store (FedCDA: one round): every file it reads is checked
        once more against its CRC-32, once."""
        self._verified.clear()

    # ----------------------------------------------------------------- update

    def add(self, client: int, rnd: int, vec: Vec, loss: float, sq: float, ints: Params,
            owned: bool = False) -> Entry:
        """Cache a new model of ``client``; the oldest goes when K are held.

        ``owned=True`` hands ``vec`` over to a RAM store without a copy.
        """
        q = self.entries.setdefault(client, deque())
        if any(e.round == rnd for e in q):
            raise ValueError(f"client {client} already has a model from round {rnd}")
        crc = None
        if self.directory is None:
            self._ram[(client, rnd)] = vec if owned else np.array(vec, copy=True)
        else:
            path = self._path(client, rnd)
            tmp = path.with_suffix(".tmp.npy")
            flat = np.ascontiguousarray(vec)
            np.save(tmp, flat)
            crc = zlib.crc32(flat.data)  # the bytes np.save wrote after its header
            os.replace(tmp, path)
        entry = Entry(rnd, float(loss), float(sq), {k: v.copy() for k, v in ints.items()}, crc)
        q.append(entry)
        while len(q) > self.capacity:
            old = q.popleft()
            self._ram.pop((client, old.round), None)
            if self.directory is not None and self._path(client, old.round).name not in (
                    self._kept_before | self._kept_prev):
                self._path(client, old.round).unlink(missing_ok=True)  # no checkpoint needs it
        return entry

    # ----------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Metadata, plus the vectors themselves for the RAM store."""
        state: dict[str, Any] = {
            "capacity": self.capacity,
            "entries": {
                c: [(e.round, e.loss, e.sq, {k: v.copy() for k, v in e.ints.items()}, e.crc)
                    for e in q]
                for c, q in self.entries.items()
            },
        }
        if self.directory is None:
            state["vectors"] = {k: v.copy() for k, v in self._ram.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the disk store checks its files are there."""
        self.capacity = int(state["capacity"])
        self.entries = {
            int(c): deque(Entry(int(r), float(f), float(s), dict(i), crc)
                          for r, f, s, i, crc in rows)
            for c, rows in state["entries"].items()
        }
        if self.directory is None:
            self._ram = {tuple(k): np.array(v, copy=True) for k, v in state["vectors"].items()}
        else:
            bad = self.check_files()
            if bad:
                raise CacheFileError(
                    f"the FedCDA disk cache {self.directory} has {len(bad)} unusable model "
                    f"file(s) named in the checkpoint: {'; '.join(bad[:3])}"
                    + (" ..." if len(bad) > 3 else ""))
            self.collect()

    def check_files(self) -> list[str]:
        """Every entry's file: there, a readable ``.npy`` header, one 1-D shape and dtype
        for all, exactly as long as its header says (truncation shows here), and its data
        bytes those written (their CRC-32: a bit flipped since shows here).  Returns one
        line per unusable file."""
        if self.directory is None:
            return []
        bad: list[str] = []
        seen: set[tuple[tuple[int, ...], str]] = set()
        for c, q in sorted(self.entries.items()):
            for e in q:
                path = self._path(c, e.round)
                try:
                    with path.open("rb") as f:
                        version = np.lib.format.read_magic(f)
                        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read(f)
                        need = f.tell() + int(np.prod(shape)) * dtype.itemsize
                        crc = 0
                        while e.crc is not None and (chunk := f.read(1 << 22)):
                            crc = zlib.crc32(chunk, crc)
                except FileNotFoundError:
                    bad.append(f"{path.name} is missing")
                    continue
                except (OSError, ValueError) as exc:
                    bad.append(f"{path.name} is not a numpy array file ({exc})")
                    continue
                size = path.stat().st_size
                if len(shape) != 1 or size != need:
                    bad.append(f"{path.name} holds {size} bytes where its header "
                               f"{shape} {dtype} needs {need}")
                elif e.crc is not None and crc != e.crc:
                    bad.append(_changed(path, crc, e.crc))
                seen.add((tuple(shape), dtype.str))
        if len(seen) > 1:
            bad.append(f"the files disagree on shape or dtype: {sorted(seen)}")
        return bad

    def collect(self) -> int:
        """Delete files of the disk store that neither the current entries nor those of
        the previous collection (the previous checkpoint's) refer to; return how many.

        Call only when the state that refers to the current entries is safely on
        disk (after a checkpoint), never between a checkpoint and its successor's
        write.
        """
        if self.directory is None:
            return 0
        now = {self._path(c, e.round).name for c, q in self.entries.items() for e in q}
        # the previous checkpoint (kept beside the latest for a fallback) refers to the
        # entries of the last collection: their files live one checkpoint longer
        keep = now | self._kept_before
        self._kept_prev, self._kept_before = self._kept_before, now
        gone = 0
        for p in self.directory.glob("c*-r*.npy"):
            if p.name not in keep:
                p.unlink(missing_ok=True)
                gone += 1
        for p in self.directory.glob("*.tmp.npy"):
            p.unlink(missing_ok=True)
        return gone

    def nbytes_on_disk(self) -> int:
        """Bytes of the store's files (0 for RAM)."""
        if self.directory is None:
            return 0
        return sum(p.stat().st_size for p in self.directory.glob("c*-r*.npy"))

    def nbytes_in_ram(self) -> int:
        """Bytes of vectors held in RAM (0 for the disk store)."""
        return sum(v.nbytes for v in self._ram.values())
