"""Server optimisers on the pseudo-gradient (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021), in the form the IMA paper's code uses (spec ``fedima.md``
§2.5): no bias correction unless asked for.

With ``delta = x - w`` (x the aggregate, w the current global model)::

    m <- b1 m + (1 - b1) delta
    v <- b2 v + (1 - b2) delta^2                          (Adam)
    v <- v - (1 - b2) delta^2 sign(v - delta^2)           (Yogi)
    w <- w + lr m / (sqrt(v) + tau)

Flower's legacy ``FedAdam`` additionally scales lr by
``sqrt(1 - b2^t) / (1 - b1^t)`` (bias correction); ``bias_correction=True`` does the
same here.  Moments start at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params, is_float


@dataclass(frozen=True)
class OptConfig:
    """Hyperparameters (paper defaults: lr 0.01, tau 1e-3, b1 0.9, b2 0.99)."""

    lr: float = 0.01
    tau: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99
    bias_correction: bool = False


def step(
    kind: str,
    weights: Params,
    aggregate: Params,
    m: dict[str, NDArray[np.float64]],
    v: dict[str, NDArray[np.float64]],
    t: int,
    cfg: OptConfig,
) -> Params:
    """One Adam or Yogi server step; updates ``m`` and ``v`` in place.

    Parameters
    ----------
    kind : {"adam", "yogi"}
    weights, aggregate : Params
        Current global model and the clients' aggregate (same keys).
    m, v : dict
        First and second moments per floating-point entry (float64), created on
        first use.
    t : int
        The bias correction's exponent: the 1-based step (fedsys's strategies pass
        ``server_round + 1``, as Flower's FedAdam does).
    cfg : OptConfig

    Returns
    -------
    Params
        The new global model; integer entries come from ``aggregate``.
    """
    if kind not in ("adam", "yogi"):
        raise ValueError(f"unknown server optimiser {kind!r}")
    lr = cfg.lr
    if cfg.bias_correction:
        lr = lr * np.sqrt(1 - cfg.beta2**t) / (1 - cfg.beta1**t)
    out: Params = {}
    for k, w in weights.items():
        if not is_float(w):
            out[k] = aggregate[k].copy()
            continue
        w64 = np.asarray(w, np.float64)
        delta = np.asarray(aggregate[k], np.float64) - w64
        mk = m.setdefault(k, np.zeros(w.shape))
        vk = v.setdefault(k, np.zeros(w.shape))
        mk *= cfg.beta1
        mk += (1 - cfg.beta1) * delta
        d2 = delta * delta
        if kind == "adam":
            vk *= cfg.beta2
            vk += (1 - cfg.beta2) * d2
        else:
            vk -= (1 - cfg.beta2) * d2 * np.sign(vk - d2)
        out[k] = (w64 + lr * mk / (np.sqrt(vk) + cfg.tau)).astype(w.dtype)
    return out


def momentum_step(weights: Params, aggregate: Params, velocity: dict[str, NDArray[np.float64]],
                  lr: float, momentum: float) -> Params:
    r"""FedAvgM's server step (Hsu, Qi & Brown 2019, §3; Flower's ``FedAvgM``): with
    :math:`\Delta = w - x` (``x`` the clients' aggregate), :math:`v \leftarrow \beta v +
    \Delta` (:math:`v = \Delta` at the first step) and :math:`w \leftarrow w - \eta v`.

    Parameters
    ----------
    weights, aggregate : Params
        Current global model and the clients' aggregate (same keys).
    velocity : dict
        The velocity per floating-point entry (float64), created on first use and
        updated in place; kept only while ``momentum`` > 0, as Flower keeps it.
    lr, momentum : float
        :math:`\eta` and :math:`\beta`.

    Returns
    -------
    Params
        The new global model: ``aggregate`` itself when :math:`\eta = 1, \beta = 0`
        (FedAvg, as Flower's switch ``server_opt`` skips the step); integer entries
        come from ``aggregate``.
    """
    if lr == 1.0 and momentum == 0.0:
        return aggregate
    out: Params = {}
    for k, w in weights.items():
        if not is_float(w):
            out[k] = aggregate[k].copy()
            continue
        w64 = np.asarray(w, np.float64)
        step = w64 - np.asarray(aggregate[k], np.float64)
        if momentum > 0.0:
            if k in velocity:
                velocity[k] *= momentum
                velocity[k] += step
            else:
                velocity[k] = step.copy()
            step = velocity[k]
        out[k] = np.asarray(w64 - lr * step).astype(w.dtype)
    return out
