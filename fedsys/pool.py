r"""Model pools: distances of a model to a pool and to an anchor, and their gradient.

FedELMY (Wang et al., ACM MM 2024, Eqs. 7-9) and Local Superior Soups (Chen et al.,
NeurIPS 2024, Eqs. 4-5) both train a new pool member on its task loss minus a weighted
mean L2 distance to the pool members (diversity) plus a weighted L2 distance to the
received model (proximity / affinity), over the trainable parameters as one vector.
:func:`distance_gradient` is that regulariser's gradient in closed form, built in place
(autograd would keep one difference vector per pool member for the backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def flat(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors as one vector (differentiable; used for the live model)."""
    return torch.cat([p.reshape(-1) for p in params])


def trainable_params(net: nn.Module) -> list[torch.Tensor]:
    """``net``'s parameters that train (``requires_grad``), in order."""
    return [p for p in net.parameters() if p.requires_grad]


def trainable_vector(net: nn.Module) -> torch.Tensor:
    """A detached copy of ``net``'s trainable parameters as one vector (an anchor)."""
    return flat([p.detach() for p in trainable_params(net)]).clone()


def distances(theta: torch.Tensor, pool: Sequence[torch.Tensor],
              m0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The mean L2 distance to the pool and the distance to the anchor:
    :math:`\frac{1}{|M|}\sum_t\lVert\theta - m_t\rVert_2`, :math:`\lVert\theta - a\rVert_2`
    (FedELMY Eqs. 7-8 with :math:`a = m_0`; LSS Eqs. 4-5 with :math:`a = f_p`)."""
    d1 = torch.stack([torch.linalg.vector_norm(theta - a) for a in pool]).mean()
    return d1, torch.linalg.vector_norm(theta - m0)


def distance_gradient(theta: torch.Tensor, pool: Sequence[torch.Tensor], m0: torch.Tensor,
                      alpha: float, beta: float, scale: float = 1.0
                      ) -> tuple[torch.Tensor, float, float]:
    r"""Gradient of :math:`(-\alpha d_1 + \beta d_2)/s` (``d1, d2`` of :func:`distances`:
    repelled from the pool, pulled to the anchor ``m0``), with :math:`d_1` and :math:`d_2`:

    .. math:: \frac{1}{s}\Big[-\frac{\alpha}{|M|}\sum_t
              \frac{\theta - m_t}{\lVert\theta - m_t\rVert}
              + \beta\,\frac{\theta - m_0}{\lVert\theta - m_0\rVert}\Big],

    a term being 0 at distance 0 (the subgradient :func:`torch.linalg.vector_norm`
    takes, so the first step of :math:`m_1` is finite).  Built in place: one vector
    and one temporary besides the pool, where autograd would keep a difference per
    pool model for the backward pass.
    """
    with torch.no_grad():
        grad = torch.zeros_like(theta)
        diff = torch.empty_like(theta)
        d1 = 0.0
        for a in pool:
            torch.sub(theta, a, out=diff)
            norm = float(torch.linalg.vector_norm(diff))
            d1 += norm
            if norm > 0:
                grad.add_(diff, alpha=-alpha / (len(pool) * norm * scale))
        torch.sub(theta, m0, out=diff)
        d2 = float(torch.linalg.vector_norm(diff))
        if d2 > 0:
            grad.add_(diff, alpha=beta / (d2 * scale))
        return grad, d1 / len(pool), d2


def add_to_grads(params: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Add a flat vector to the ``.grad`` of each parameter (in order)."""
    at = 0
    for p in params:
        n = p.numel()
        g = vector[at : at + n].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.add_(g)
        at += n


__all__ = ["add_to_grads", "distance_gradient", "distances", "flat", "trainable_params",
           "trainable_vector"]
