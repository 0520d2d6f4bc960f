"""Robust replacements for the mean of a round's models (issue 42 item 2): the
coordinate-wise median and trimmed mean (Yin et al., "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates", ICML 2018, Defs. 1-2) and multi-Krum
(Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent", NeurIPS 2017, §4: Krum's score and its m-selection variant).

Each takes models with identical keys, shapes and dtypes and returns one; floating-point
entries are computed in float64 and cast back, integer buffers follow fedsys's one rule
(the element-wise maximum, :func:`fedsys.params.mean`).  None of them reads example counts:
a claimed weight cannot buy influence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params, flatten, is_float, mean


def _stack(models: Sequence[Params], key: str) -> NDArray[np.float64]:
    return np.stack([np.asarray(m[key], np.float64) for m in models])


def _coordinatewise(models: Sequence[Params], rule: str, beta: float = 0.0) -> Params:
    if not models:
        raise ValueError(f"{rule} needs at least one model")
    ints = mean([{k: v for k, v in m.items() if not is_float(v)} for m in models])
    out: Params = {}
    for k, v in models[0].items():
        if not is_float(v):
            out[k] = ints[k]
            continue
        x = _stack(models, k)
        if rule == "median":
            agg = np.median(x, axis=0)
        else:
            cut = math.floor(beta * len(models))
            agg = np.sort(x, axis=0)[cut:len(models) - cut].mean(axis=0)
        out[k] = agg.astype(v.dtype)
    return out


def coordinate_median(models: Sequence[Params]) -> Params:
    r"""The coordinate-wise median, :math:`\mathrm{med}\{w_k^{(j)}\}_k` for every
    coordinate :math:`j` (Yin et al. 2018, Def. 1; the mean of the two middle values for
    an even count)."""
    return _coordinatewise(models, "median")


def trimmed_mean(models: Sequence[Params], beta: float) -> Params:
    r"""The coordinate-wise :math:`\beta`-trimmed mean: per coordinate, the largest and
    the smallest :math:`\lfloor\beta n\rfloor` values dropped and the rest averaged (Yin et
    al. 2018, Def. 2); ``beta`` in [0, 0.5)."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed mean: beta must be in [0, 0.5), got {beta}")
    if 2 * math.floor(beta * len(models)) >= len(models):
        raise ValueError(f"trimmed mean: beta {beta} leaves none of {len(models)} models")
    return _coordinatewise(models, "trimmed", beta)


def krum_scores(models: Sequence[Params], f: int) -> NDArray[np.float64]:
    r"""Krum's score of each model: the sum of its squared L2 distances to its
    :math:`n - f - 2` nearest other models (Blanchard et al. 2017, §4; at least one
    neighbour when :math:`n \le f + 2`)."""
    x = np.stack([flatten(m) for m in models])
    sq = np.sum(x * x, axis=1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    n = len(models)
    k = max(n - f - 2, 1)
    return np.array([np.sort(np.delete(d[i], i))[:k].sum() for i in range(n)]) if n > 1 \
        else np.zeros(1)


def multi_krum(models: Sequence[Params], f: int, m: int | None = None) -> tuple[Params, list[int]]:
    r"""Multi-Krum: the uniform mean of the ``m`` models with the lowest Krum scores
    (default :math:`n - f`; ``m = 1`` is Krum itself), and the indices it kept (ties go
    to the earlier model)."""
    n = len(models)
    keep = n - f if m is None else m
    if not 1 <= keep <= n:
        raise ValueError(f"multi-Krum: keeping {keep} of {n} models (f = {f}) is not possible")
    order = np.argsort(krum_scores(models, f), kind="stable")[:keep]
    kept = sorted(int(i) for i in order)
    return mean([models[i] for i in kept]), kept


__all__ = ["coordinate_median", "krum_scores", "multi_krum", "trimmed_mean"]
