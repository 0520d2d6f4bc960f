"""Aggregation maths as small pure functions on :data:`fedsys.params.Params`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsys.params import Params, is_float


def weighted_average(models: Sequence[Params], weights: Sequence[float]) -> Params:
    """Weighted mean of models (FedAvg, McMahan et al. 2017, Alg. 1).

    ``w = sum_k (n_k / n) w_k`` over floating-point entries, computed in float64 and
    cast back to each entry's dtype.  Integer entries (for example BatchNorm's
    ``num_batches_tracked``) cannot be averaged meaningfully; the entry of the model
    with the largest weight is kept.

    Parameters
    ----------
    models : sequence of Params
        Models with identical keys, shapes and dtypes.
    weights : sequence of float
        Non-negative weights, typically the clients' example counts.

    Returns
    -------
    Params
        The averaged model.
    """
    if not models:
        raise ValueError("weighted_average needs at least one model")
    if len(models) != len(weights):
        raise ValueError("models and weights differ in length")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    w = w / w.sum()
    top = int(np.argmax(w))
    out: Params = {}
    for key, ref in models[0].items():
        if is_float(ref):
            acc = np.zeros(ref.shape, dtype=np.float64)
            for m, wk in zip(models, w, strict=True):
                acc += wk * m[key]
            out[key] = acc.astype(ref.dtype)
        else:
            out[key] = models[top][key].copy()
    return out
