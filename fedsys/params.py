"""Model parameters as ordered ``{name: ndarray}`` dicts, and checks on them.

Strategies hold models as :data:`Params`, a plain ordered mapping from state-dict
name to numpy array.  Conversion to and from torch happens here; conversion to
Flower records happens in :mod:`fedsys.flwr_io`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import NDArray

Params = dict[str, NDArray[np.generic]]


def from_torch(state_dict: Mapping[str, torch.Tensor]) -> Params:
    """Copy a torch ``state_dict`` into numpy arrays (CPU, same dtypes)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in state_dict.items()}


def to_torch(params: Params) -> dict[str, torch.Tensor]:
    """Turn :data:`Params` into a torch ``state_dict`` (CPU tensors)."""
    return {k: torch.from_numpy(np.array(v, copy=True, order="C")) for k, v in params.items()}


def copy(params: Params) -> Params:
    """Deep copy."""
    return {k: v.copy() for k, v in params.items()}


def is_float(a: NDArray[np.generic]) -> bool:
    """True for floating-point entries (weights, BatchNorm running stats)."""
    return bool(np.issubdtype(a.dtype, np.floating))


def num_bytes(params: Params) -> int:
    """Total payload size in bytes."""
    return int(sum(v.nbytes for v in params.values()))


def checksum(params: Params) -> str:
    """SHA-256 over names, shapes, dtypes and bytes (order-sensitive)."""
    h = hashlib.sha256()
    for k, v in params.items():
        h.update(k.encode())
        h.update(str(v.shape).encode())
        h.update(str(v.dtype).encode())
        h.update(np.require(v, requirements="C").tobytes())
    return h.hexdigest()


def check_update(update: Params, reference: Params) -> str | None:
    """Return why ``update`` cannot be aggregated with ``reference``, or ``None``.

    Rejects missing or extra keys, shape or dtype mismatches, and NaN or Inf in any
    floating-point entry.
    """
    missing = [k for k in reference if k not in update]
    if missing:
        return f"missing arrays {missing[:3]}{'...' if len(missing) > 3 else ''}"
    extra = [k for k in update if k not in reference]
    if extra:
        return f"unexpected arrays {extra[:3]}{'...' if len(extra) > 3 else ''}"
    for k, ref in reference.items():
        got = update[k]
        if got.shape != ref.shape:
            return f"array '{k}' has shape {got.shape}, expected {ref.shape}"
        if got.dtype != ref.dtype:
            return f"array '{k}' has dtype {got.dtype}, expected {ref.dtype}"
        if is_float(got) and not np.all(np.isfinite(got)):
            return f"array '{k}' holds NaN or Inf"
    return None


def flatten(params: Params, float_only: bool = True) -> NDArray[np.float64]:
    """Concatenate (floating-point) entries into one float64 vector."""
    parts = [v.ravel() for v in params.values() if is_float(v) or not float_only]
    if not parts:
        return np.zeros(0)
    return np.concatenate(parts).astype(np.float64, copy=False)
