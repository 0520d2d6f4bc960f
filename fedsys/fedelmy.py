r"""FedELMY's local objective (Wang et al., "One-Shot Sequential Federated Learning for
Non-IID Data by Enhancing Local Model Diversity", ACM MM 2024, §3.3, Eqs. 5-9).

A client keeps a pool :math:`M = \{m_0, m_1, \dots\}` seeded with the received model
:math:`m_0`; each new model :math:`m_j` starts at the pool's uniform mean (Eq. 6) and
minimises (Eq. 9)

.. math:: L(m_j) = \ell(m_j; D) - \alpha\, d_1 + \beta\, d_2,

:math:`d_1 = \frac{1}{|M|}\sum_t \lVert m_j - m_t\rVert_2` (Eq. 7, diversity),
:math:`d_2 = \lVert m_j - m_0\rVert_2` (Eq. 8, proximity), over the trainable
parameters as one vector.  The reply is the pool's uniform mean (Eq. 5).

Two forms (spec ``fedelmy.md`` §2.2, §7):

* **paper** (default): the non-squared L2 norms above, pairwise over the pool, so
  every pool model's parameters are kept as an anchor; the distances and their
  closed-form gradient are :mod:`fedsys.pool`'s (shared with Local Superior Soups);
* **code** (the official implementation): squared L2, the new model's own start as
  one more anchor, and one loss-relative factor ``s`` (:func:`magnitude_scale`)
  dividing both terms.  With squared distances the anchors' mean is the start
  :math:`\theta_{s}`, so the regulariser's gradient is the closed form
  :func:`code_gradient`, which needs two model copies instead of the whole pool.

Pure functions on flat parameter vectors (see :mod:`fedsys.pool`); the trainer is
:mod:`clients.fedelmy`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

# torch is imported where it is used: the chain strategies read this module's reply keys
# without loading it
if TYPE_CHECKING:
    import torch

FORMS = ("paper", "code")
#: A pool whose distance terms' gradient outweighs the loss's (the ratio of their norms, the
#: pool's mean, above this) while App. A's ``s`` stayed 1 is held near the received model
#: (:func:`pool_held`).
HELD_RATIO = 1.0
#: The reply metrics of FedELMY's trainer: that ratio, and whether the pool was held (1.0
#: held, 0.0 not), read by the chain strategies to warn the server's log.
GRAD_RATIO, POOL_HELD = "grad-ratio", "pool-held"


def pool_held(ratio: float, scales: Sequence[float]) -> bool:
    r"""Whether a client's pool stayed near the received model ``m_0`` and learnt little.

    Eq. 9's pull :math:`\beta\,\nabla d_2 / s` has norm :math:`\beta / s` at any
    distance, and App. A's ``s`` is 1 until :math:`d_2` reaches the loss's decade
    (:func:`magnitude_scale`); on a small model, whose loss gradient is small, the pool never
    gets there.  Held: the regulariser's gradient norm over the loss's (``ratio``, the pool's
    mean) above :data:`HELD_RATIO` while every pool model's ``s`` (``scales``) was 1.  A
    converged model's loss gradient is small too, but its small loss makes ``s`` large at
    once: not held.

    >>> pool_held(2.0, [1.0, 1.0]), pool_held(2.0, [1.0, 10.0]), pool_held(0.1, [1.0])
    (True, False, False)
    """
    return ratio > HELD_RATIO and bool(scales) and all(sc == 1.0 for sc in scales)


def magnitude_scale(loss: float, distance: float) -> float:
    r"""The official code's order-of-magnitude factor ``s`` (spec §2.2, paper App. A).

    ``s = 10^(o_d - o_l + 1)`` when :math:`o_d > o_l - 1`, else 1, where
    :math:`o_x = \lfloor \log_{10} x \rfloor`; so ``distance / s`` lies one decade below
    the loss.  ``s = 1`` when either value is not positive or not finite (the code
    crashes on a zero loss; spec §6.3).  A float: no gradient flows through it.

    >>> magnitude_scale(6.02, 45.0), magnitude_scale(2.3, 1234.0), magnitude_scale(0.05, 3.0)
    (100.0, 10000.0, 1000.0)
    """
    if not (loss > 0 and distance > 0 and math.isfinite(loss) and math.isfinite(distance)):
        return 1.0
    o_l, o_d = math.floor(math.log10(loss)), math.floor(math.log10(distance))
    return float(10.0 ** (o_d - o_l + 1)) if o_d > o_l - 1 else 1.0


def code_distances(theta: torch.Tensor, anchors: Sequence[torch.Tensor],
                   m0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The official code's terms: :math:`d_1 = \frac1K\sum_k\lVert\theta - a_k\rVert^2`
    over the pool and the start (``anchors``, K = j + 1), :math:`d_2 =
    \lVert\theta - m_0\rVert^2`.  For tests and logging; training uses
    :func:`code_gradient`."""
    import torch

    d1 = torch.stack([((theta - a) ** 2).sum() for a in anchors]).mean()
    return d1, ((theta - m0) ** 2).sum()


def objective(ce: torch.Tensor, d1: torch.Tensor, d2: torch.Tensor, alpha: float,
              beta: float, scale: float = 1.0) -> torch.Tensor:
    r"""Eq. 9, :math:`\ell - \alpha d_1/s + \beta d_2/s` (``s = 1``: the paper as
    written)."""
    return ce - alpha * d1 / scale + beta * d2 / scale


def code_gradient(theta: torch.Tensor, m0: torch.Tensor, start: torch.Tensor, alpha: float,
                  beta: float, scale: float = 1.0) -> torch.Tensor:
    r"""Closed-form gradient of the code form's regulariser (spec §2.2):

    .. math:: \nabla_\theta\,\frac{-\alpha d_1 + \beta d_2}{s}
              = \frac{2}{s}\left[\beta(\theta - m_0) - \alpha(\theta - \theta_s)\right],

    exact because the squared distances' anchors (pool plus start) average to the
    start :math:`\theta_s` (Eq. 6).  Two model copies (``m0``, ``start``), not j + 1.
    """
    import torch

    with torch.no_grad():
        grad = torch.sub(theta, m0).mul_(2.0 * beta / scale)
        return grad.add_(torch.sub(theta, start), alpha=-2.0 * alpha / scale)


__all__ = ["FORMS", "GRAD_RATIO", "HELD_RATIO", "POOL_HELD", "code_distances", "code_gradient",
           "magnitude_scale", "objective", "pool_held"]
