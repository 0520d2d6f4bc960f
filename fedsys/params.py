"""Model parameters as ordered ``{name: ndarray}`` dicts, and checks on them.

Strategies hold models as :data:`Params`, a plain ordered mapping from state-dict
name to numpy array.  Conversion to and from torch happens here (torch is imported
only when called); conversion to Flower records happens in :mod:`fedsys.protocol`.

The one mean of models (:func:`mean`) and the one flattening (:func:`flatten` /
:func:`unflatten`) live here; every method uses them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import torch

Params = dict[str, NDArray[np.generic]]


def from_torch(state_dict: Mapping[str, torch.Tensor]) -> Params:
    """Copy a torch ``state_dict`` into numpy arrays (CPU, same dtypes)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in state_dict.items()}


def to_torch(params: Params) -> dict[str, torch.Tensor]:
    """Turn :data:`Params` into a torch ``state_dict`` (CPU tensors)."""
    import torch

    return {k: torch.from_numpy(np.array(v, copy=True, order="C")) for k, v in params.items()}


def copy(params: Params) -> Params:
    """Deep copy."""
    return {k: v.copy() for k, v in params.items()}


def is_float(a: NDArray[np.generic]) -> bool:
    """True for floating-point entries (weights, BatchNorm running stats)."""
    return _floating(a.dtype)


@functools.lru_cache(maxsize=64)
def _floating(dtype: np.dtype) -> bool:
    """``np.issubdtype(dtype, np.floating)``, asked once per dtype (a round asks it for
    every array of every update: thousands of calls of a few microseconds)."""
    return bool(np.issubdtype(dtype, np.floating))


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


def mean(models: Sequence[Params], weights: Sequence[float] | None = None) -> Params:
    r"""The mean of models: uniform, or weighted by ``weights``.

    Floating-point entries (weights and BatchNorm running statistics) are accumulated
    in float64 in the order given and cast back to their dtype: uniform,
    :math:`\frac{1}{n}\sum_k w_k` (the sum, then one division); weighted,
    :math:`\sum_k \frac{n_k}{n} w_k` (FedAvg, McMahan et al. 2017, Alg. 1).

    **Integer buffers** (BatchNorm's ``num_batches_tracked``) cannot be averaged; the
    rule for them in every fedsys mean is the element-wise maximum over the models (the
    most batches any of them tracked); the robust rules of :mod:`fedsys.robust` apply
    their own rule to them instead, rounded, so that one attacker cannot set them.  With BatchNorm's default
    momentum the count does not enter the forward pass.

    Parameters
    ----------
    models : sequence of Params
        Models with identical keys, shapes and dtypes.
    weights : sequence of float, optional
        Non-negative weights with a positive sum (typically example counts).

    Returns
    -------
    Params
        The mean, keys in the order of the first model.
    """
    if not models:
        raise ValueError("mean needs at least one model")
    w: NDArray[np.float64] | None = None
    if weights is not None:
        if len(models) != len(weights):
            raise ValueError("models and weights differ in length")
        w = np.asarray(weights, dtype=np.float64)
        if np.any(w < 0) or not w.sum() > 0:
            raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
        w = w / w.sum()
    if w is None:
        run = RunningMean()
        for m in models:
            run.add(m)
        return run.mean()
    out: Params = {}
    for key, ref in models[0].items():
        if not is_float(ref):
            out[key] = np.asarray(np.max(np.stack([m[key] for m in models]), axis=0),
                                  dtype=ref.dtype)
            continue
        acc = np.zeros(ref.shape, dtype=np.float64)
        for m, wk in zip(models, w, strict=True):
            acc += wk * m[key]
        out[key] = acc.astype(ref.dtype)
    return out


class RunningMean:
    """The uniform :func:`mean` of models added one at a time, holding one float64 sum
    (not the models): ``mean()`` after adding ``m_1..m_n`` equals ``mean([m_1..m_n])``
    bit for bit (same order of additions, one division, integer buffers by maximum).

    A client's model pool (FedELMY, LSS) averages S+1 models this way with one
    accumulator instead of S+1 copies.
    """

    def __init__(self) -> None:
        self.count = 0
        self._acc: dict[str, NDArray[Any]] = {}
        self._dtypes: dict[str, np.dtype] = {}

    def add(self, model: Params) -> None:
        """Add one model (same keys, shapes and dtypes as the first)."""
        first = not self._acc
        for k, v in model.items():
            if first:
                self._dtypes[k] = v.dtype
                self._acc[k] = np.zeros(v.shape, np.float64) if is_float(v) else np.array(v)
            if is_float(v):
                self._acc[k] += np.asarray(v, dtype=np.float64)
            elif not first:
                self._acc[k] = np.maximum(self._acc[k], v)
        self.count += 1

    def mean(self) -> Params:
        """The uniform mean of the models added so far."""
        if not self.count:
            raise ValueError("mean needs at least one model")
        return {k: ((a / self.count).astype(self._dtypes[k]) if np.issubdtype(a.dtype, np.floating)
                    else np.asarray(a, dtype=self._dtypes[k]))
                for k, a in self._acc.items()}


def flatten(params: Params) -> NDArray[np.float64]:
    """The floating-point entries, concatenated in key order, as one float64 vector.

    Integer entries are left out; :func:`unflatten` is the inverse.
    """
    parts = [np.asarray(v, np.float64).ravel() for v in params.values() if is_float(v)]
    if not parts:
        return np.zeros(0)
    return np.concatenate(parts)


def distance(a: Params, b: Params) -> float:
    """L2 distance between two models over their floating-point entries (:func:`flatten`)."""
    return distance_to(a, flatten(b))


def distance_to(a: Params, flat_b: NDArray[np.float64]) -> float:
    """:func:`distance` from ``a`` to the model whose :func:`flatten` is ``flat_b`` (a model
    many are measured against, flattened once)."""
    parts = [v for v in a.values() if is_float(v)]
    if sum(v.size for v in parts) != len(flat_b):
        return float(np.linalg.norm(flatten(a) - flat_b))  # numpy's error for the sizes
    d = np.empty_like(flat_b)  # flatten(a) - flat_b in one array: the same values
    at = 0
    for v in parts:
        d[at : at + v.size] = v.ravel()
        at += v.size
    return float(np.linalg.norm(np.subtract(d, flat_b, out=d)))


def unflatten(vec: NDArray[np.floating], like: Params) -> Params:
    """Inverse of :func:`flatten`: dtypes, shapes and integer entries from ``like``."""
    need = sum(v.size for v in like.values() if is_float(v))
    if need != len(vec):
        raise ValueError(f"vector has {len(vec)} entries, the model {need}")
    out: Params = {}
    at = 0
    for k, v in like.items():
        if is_float(v):
            out[k] = np.asarray(vec[at : at + v.size]).reshape(v.shape).astype(v.dtype)
            at += v.size
        else:
            out[k] = v.copy()
    return out
