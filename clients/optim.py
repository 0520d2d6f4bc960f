"""Local optimisers: torch's SGD and Adam steps, through torch's functional API.

``torch.optim.Optimizer`` imports ``torch._dynamo`` the first time an optimiser is built
and at every ``step`` (its methods are wrapped to keep ``torch.compile`` out): about 2.5 s
of CPU in every process that trains, which is every deployed ClientApp message and every
simulation actor.  :class:`Optimiser` keeps the optimiser state itself and calls
``torch.optim.sgd.sgd`` and ``torch.optim.adam.adam``, the functions that
``torch.optim.SGD.step`` and ``torch.optim.Adam.step`` call, with the arguments those pass
(same defaults, same per-device choice of implementation), so every update is the same to
the last bit (tests/unit/test_clients.py compares them step by step).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

KINDS = ("sgd", "adam")


class Optimiser:
    """SGD (momentum, coupled weight decay) or Adam (betas 0.9 / 0.999, eps 1e-8, coupled
    weight decay: ``torch.optim.Adam``'s defaults) over ``params``.

    The interface the trainers use of ``torch.optim.Optimizer``: :meth:`zero_grad` and
    :meth:`step`.  As there, parameters without a gradient are left out of a step, and
    their state is made on their first step.

    Raises
    ------
    ValueError
        For an optimiser other than ``sgd`` or ``adam``.
    """

    def __init__(self, params: Iterable[torch.Tensor], kind: str, lr: float,
                 momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"optimizer {kind!r}; allowed: {', '.join(KINDS)}")
        self.params = list(params)
        self.kind, self.lr = kind, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.state: dict[int, list[torch.Tensor]] = {}  # by position in params

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (``set_to_none`` is accepted for torch's signature)."""
        del set_to_none
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        import torch

        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        params = [self.params[i] for i in live]
        grads = [p.grad for p in params if p.grad is not None]
        with torch.no_grad():
            if self.kind == "sgd":
                self._sgd(live, params, grads)
            else:
                self._adam(live, params, grads)

    def step_rows(self, rows: int, grads: list[torch.Tensor]) -> None:
        """One update of the first ``rows`` rows of every parameter with ``grads`` (one per
        parameter, ``rows`` long): the step of :meth:`step` on stacked parameters, a client
        a row (:mod:`clients.batched`), where the rows after ``rows`` have finished (their
        parameters and state stay as they are; rows only ever finish from the end)."""
        import torch

        live = list(range(len(self.params)))
        params = [p[:rows] for p in self.params]
        with torch.no_grad():
            if self.kind == "sgd":
                self._sgd(live, params, grads, rows)
            else:
                self._adam(live, params, grads, rows)

    def _sgd(self, live: list[int], params: list[torch.Tensor],
             grads: list[torch.Tensor], rows: int | None = None) -> None:
        from torch.optim.sgd import sgd

        bufs: list[torch.Tensor | None] = (
            [_rows(self.state[i][0], rows) if i in self.state else None for i in live]
            if self.momentum != 0 else [])
        sgd(params, grads, bufs, has_sparse_grad=any(g.is_sparse for g in grads),
            foreach=None, fused=None, grad_scale=None, found_inf=None,
            weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr,
            dampening=0.0, nesterov=False, maximize=False)
        for i, b in zip(live, bufs, strict=False):
            if b is not None:
                self.state[i] = [b]

    def _adam(self, live: list[int], params: list[torch.Tensor],
              grads: list[torch.Tensor], rows: int | None = None) -> None:
        import torch
        from torch.optim.adam import adam

        for i in live:
            if i not in self.state:  # as Adam._init_group (not fused, not capturable)
                p = self.params[i]
                dtype = torch.float64 if torch.get_default_dtype() == torch.float64 \
                    else torch.float32
                self.state[i] = [torch.tensor(0.0, dtype=dtype, device="cpu"),
                                 torch.zeros_like(p, memory_format=torch.preserve_format),
                                 torch.zeros_like(p, memory_format=torch.preserve_format)]
        # the step count is one for every row: the rows still training have all taken
        # the same number of steps
        steps = [self.state[i][0] for i in live]
        avgs, sqs = ([_rows(self.state[i][k], rows) for i in live] for k in (1, 2))
        adam(params, grads, avgs, sqs, [], steps, foreach=None, capturable=False,
             differentiable=False, fused=None, grad_scale=None, found_inf=None,
             has_complex=any(torch.is_complex(p) for p in params),
             decoupled_weight_decay=False, amsgrad=False, beta1=0.9, beta2=0.999,
             lr=self.lr, weight_decay=self.weight_decay, eps=1e-8, maximize=False)


def _rows(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    """``t`` itself, or its first ``rows`` rows (a view)."""
    return t if rows is None else t[:rows]
