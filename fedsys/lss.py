r"""Local Superior Soups' maths (Chen et al., "Local Superior Soups: A Catalyst for Model
Merging in Cross-Silo Federated Learning", NeurIPS 2024, Alg. 1; spec ``lss.md``).

Each step trains the newest pool member on the loss at a random convex combination of
the pool (:func:`simplex_weights`, :func:`interpolate`), so the gradient reaches only
that member, scaled by its coefficient.  The paper form's affinity and diversity terms
(Eqs. 4-5) are :mod:`fedsys.pool`'s distances; the official code's diversity is the
squared volume of the simplex the vertices span (:func:`cayley_menger_volume2`, whose
gradient with respect to the newest vertex is :func:`volume_gradient`).  Pure functions
on flat parameter vectors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def simplex_weights(k: int, generator: torch.Generator) -> torch.Tensor:
    r"""Coefficients drawn uniformly from the simplex :math:`\Delta^{k-1}` (Dirichlet(1),
    as :math:`e_j = -\log u_j` normalised: the official code's sampler; normalised uniform
    draws would not be uniform on the simplex, spec §6 P7)."""
    e = -torch.rand(k, generator=generator, dtype=torch.float64).log()
    return e / e.sum()


def interpolate(frozen: Sequence[torch.Tensor], live: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
    r""":math:`f_s = \sum_{j<K} \alpha_j M_j + \alpha_K f_i` (Alg. 1 line 7), differentiable
    only through ``live`` (the member being trained, the last coefficient)."""
    with torch.no_grad():
        const = torch.zeros_like(live)
        for w, m in zip(weights[:-1].tolist(), frozen, strict=True):
            const.add_(m, alpha=w)
    return const + float(weights[-1]) * live


def cayley_menger_volume2(sq_dist: torch.Tensor) -> torch.Tensor:
    r"""Squared volume of the simplex with pairwise squared distances ``sq_dist`` (K x K):

    .. math:: \mathrm{Vol}^2 = \frac{|\det CM|}{((K-1)!)^2\, 2^{K-1}},\quad
              CM = \begin{pmatrix} D & 1 \\ 1^\top & 0 \end{pmatrix}

    (K = 2: the squared length; 3: the squared area; 4: the squared volume).
    Differentiable in ``sq_dist``.
    """
    k = sq_dist.shape[0]
    cm = torch.ones(k + 1, k + 1, dtype=sq_dist.dtype)
    cm[k, k] = 0
    cm = cm.clone()
    cm[:k, :k] = sq_dist
    return torch.det(cm).abs() / (math.factorial(k - 1) ** 2 * 2 ** (k - 1))


def volume_gradient(theta: torch.Tensor, others: Sequence[torch.Tensor]
                    ) -> tuple[torch.Tensor, float]:
    r"""Gradient of :math:`\mathrm{Vol}^2` of the simplex (``others`` + ``theta``) with
    respect to ``theta``, and the volume:
    :math:`\sum_b \frac{\partial \mathrm{Vol}^2}{\partial d_b}\, 2(\theta - v_b)` with
    :math:`d_b = \lVert\theta - v_b\rVert^2` (the small K x K determinant is
    differentiated by autograd; no model-size autograd graph)."""
    k = len(others) + 1
    with torch.no_grad():
        pts = [*others, theta]
        d = torch.zeros(k, k, dtype=torch.float64)
        for a in range(k):
            for b in range(a + 1, k):
                d[a, b] = d[b, a] = float(torch.sub(pts[a], pts[b]).pow_(2).sum())
    with torch.enable_grad():
        last = d[k - 1, : k - 1].clone().requires_grad_(True)
        full = d.clone()
        full[k - 1, : k - 1] = last
        full[: k - 1, k - 1] = last
        vol2 = cayley_menger_volume2(full)
        (g,) = torch.autograd.grad(vol2, last)
    with torch.no_grad():
        grad = torch.zeros_like(theta)
        for gb, v in zip(g.tolist(), others, strict=True):
            grad.add_(torch.sub(theta, v), alpha=2.0 * gb)
    return grad, float(vol2.detach())


__all__ = ["cayley_menger_volume2", "interpolate", "simplex_weights", "volume_gradient"]
