"""glibc's heap for a run of alike rounds: freed memory kept for the next round.

A simulated round allocates the same large blocks again and again: a round's stacked
client models and their gradients (tens of MB batched), each model's message (a few
hundred KB).  glibc's ``malloc`` serves a block above its mmap threshold (128 KiB at start,
raised as such blocks are freed) with a fresh ``mmap`` and returns free memory at the top
of its heap to the system above its trim threshold: every round then pays the page faults
of memory it had a moment before.  :func:`keep_freed_memory` raises both thresholds, as
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would (``mallopt``, glibc's own
call for them): blocks up to 32 MiB come from the heap, and up to 256 MiB of freed heap is
kept for reuse; a batched cross-device round is quicker so (``benchmarks/round_parts.py``,
docs/performance.md "The floor of a round that sends Flower's messages").
Numbers do not change (only where memory comes from); the process may hold up to the trim
threshold of freed memory it would have returned.

A user's own ``MALLOC_*`` or ``GLIBC_TUNABLES`` setting stands (nothing is set then), and
outside glibc (macOS, musl) nothing is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Mapping

#: blocks up to this size come from the heap (glibc's largest: 32 MiB on 64-bit)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free memory at the heap's top up to this size is kept
TRIM_THRESHOLD = 256 * 1024 * 1024
#: ``mallopt``'s parameter numbers (``<malloc.h>``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: the environment a user tunes glibc's heap with: any of them leaves it to the user
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")


def keep_freed_memory(environ: Mapping[str, str]) -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module
    docstring); whether they were set (not where ``environ`` holds a user's setting of
    :data:`USER_SETTINGS`, nor outside glibc on Linux)."""
    if not sys.platform.startswith("linux") or any(k in environ for k in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  # glibc's own symbol: musl has none
    except (OSError, AttributeError):
        return False
    return (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)


__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "USER_SETTINGS", "keep_freed_memory"]
