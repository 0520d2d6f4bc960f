r"""Robust replacements for the mean of a round's models (issue 42 item 2): the
coordinate-wise median and trimmed mean (Yin et al., "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates", ICML 2018, Defs. 1-2) and multi-Krum
(Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent", NeurIPS 2017, §4: Krum's score and its m-selection variant).

Each takes models with identical keys, shapes and dtypes and returns one; floating-point
entries are computed in float64 and cast back.  **Integer buffers** (BatchNorm's
``num_batches_tracked``) follow the same rule as the floats, rounded to the nearest integer
and cast back (issue 65 item D): fedsys's plain mean takes their element-wise maximum
(:func:`fedsys.params.mean`), which one attacker would set.  Multi-Krum selects on the
floating-point entries only (Blanchard's distance), so an attacker with honest weights is
kept whatever its integers: multi-Krum's integer buffers are the coordinate-wise median over
all n models instead of the mean of the kept ones.  None of the rules reads example counts:
a claimed weight cannot buy influence.

When each holds, against f attackers among n models: the median while :math:`f < n/2`; the
trimmed mean while :math:`f \le \lfloor\beta n\rfloor` (Yin et al. 2018's analyses assume
an attacker fraction :math:`\alpha < 1/2`, and :math:`\alpha \le \beta` for the trimmed
mean), so a :math:`\beta` with :math:`\lfloor\beta n\rfloor = 0` is the plain mean
(:func:`trimmed_count`); Krum and multi-Krum while :math:`n > 2f + 2` (Blanchard et al.
2017, Prop. 1; :func:`krum_holds`), and multi-Krum averaging more than :math:`n - f` models
keeps at least one of f attackers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params, flatten, is_float, mean


def _stack(models: Sequence[Params], key: str) -> NDArray[np.float64]:
    return np.stack([np.asarray(m[key], np.float64) for m in models])


def _cast(agg: NDArray[np.float64], like: NDArray[np.generic]) -> NDArray[np.generic]:
    """``agg`` in ``like``'s dtype: floats cast; integers rounded to the nearest (ties to
    even) and clipped into the dtype's range first, so no value wraps around."""
    if is_float(like):
        return agg.astype(like.dtype)
    r = np.rint(agg)
    if np.issubdtype(like.dtype, np.integer):
        info = np.iinfo(like.dtype.str)
        top = float(info.max)  # 2**63 - 1 rounds up to 2**63 in float64: the float below
        r = np.clip(r, float(info.min), top if top <= info.max else np.nextafter(top, 0.0))
    return r.astype(like.dtype)


def _coordinatewise(models: Sequence[Params], rule: str, beta: float = 0.0) -> Params:
    if not models:
        raise ValueError(f"{rule} needs at least one model")
    cut = trimmed_count(len(models), beta)
    out: Params = {}
    for k, v in models[0].items():
        x = _stack(models, k)
        if rule == "median":
            agg = np.median(x, axis=0)
        else:
            agg = np.sort(x, axis=0)[cut:len(models) - cut].mean(axis=0)
        out[k] = _cast(agg, v)
    return out


def coordinate_median(models: Sequence[Params]) -> Params:
    r"""The coordinate-wise median, :math:`\mathrm{med}\{w_k^{(j)}\}_k` for every
    coordinate :math:`j` (Yin et al. 2018, Def. 1; the mean of the two middle values for
    an even count); integer entries rounded."""
    return _coordinatewise(models, "median")


def trimmed_count(n: int, beta: float) -> int:
    r"""How many values the :math:`\beta`-trimmed mean drops at each end of a coordinate of
    ``n`` models, :math:`\lfloor\beta n\rfloor` (Yin et al. 2018, Def. 2); 0 makes it the
    plain mean (``beta`` 0.1 below 10 models)."""
    return math.floor(beta * n)


def trimmed_mean(models: Sequence[Params], beta: float) -> Params:
    r"""The coordinate-wise :math:`\beta`-trimmed mean: per coordinate, the largest and
    the smallest :math:`\lfloor\beta n\rfloor` values dropped and the rest averaged (Yin et
    al. 2018, Def. 2); ``beta`` in [0, 0.5); integer entries rounded."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed mean: beta must be in [0, 0.5), got {beta}")
    if 2 * trimmed_count(len(models), beta) >= len(models):
        raise ValueError(f"trimmed mean: beta {beta} leaves none of {len(models)} models")
    return _coordinatewise(models, "trimmed", beta)


def krum_holds(n: int, f: int) -> bool:
    r"""Whether Krum's guarantee covers ``f`` attackers among ``n`` models:
    :math:`n > 2f + 2` (Blanchard et al. 2017, Prop. 1).  With fewer, f colluders that send
    one model twice score 0 against each other and are kept (n = 5, f = 2)."""
    return n > 2 * f + 2


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
    to the earlier model).

    Raises ``ValueError`` unless :math:`n > 2f + 2` (:func:`krum_holds`) and
    :math:`1 \le m \le n`.  Integer entries are the coordinate-wise median over all
    ``n`` models, rounded (the selection does not read them).
    """
    n = len(models)
    if not krum_holds(n, f):
        raise ValueError(f"multi-Krum: {n} models with f = {f} (it needs n > 2f + 2 = "
                         f"{2 * f + 2}, Blanchard et al. 2017, Prop. 1)")
    keep = n - f if m is None else m
    if not 1 <= keep <= n:
        raise ValueError(f"multi-Krum: keeping {keep} of {n} models (f = {f}) is not possible")
    order = np.argsort(krum_scores(models, f), kind="stable")[:keep]
    kept = sorted(int(i) for i in order)
    out = mean([{k: v for k, v in models[i].items() if is_float(v)} for i in kept])
    ints = [k for k, v in models[0].items() if not is_float(v)]
    med = coordinate_median([{k: m_[k] for k in ints} for m_ in models]) if ints else {}
    return {k: out[k] if k in out else med[k] for k in models[0]}, kept


__all__ = ["coordinate_median", "krum_holds", "krum_scores", "multi_krum", "trimmed_count",
           "trimmed_mean"]
