"""Local Superior Soups (Chen et al., NeurIPS 2024, Alg. 1; spec ``lss.md`` §2.3-2.4): a
local model soup built one ingredient at a time, under any server strategy.

**paper** form (default): the pool starts with the received model :math:`f_p`; each of
``lss.ingredients`` (N) ingredients starts at the pool's uniform mean and is trained
``local-epochs`` epochs (or ``local-steps`` steps) with a fresh Adam on the task loss at a
random convex interpolation of the pool (coefficients uniform on the simplex, drawn every
step, seeded per seed, round and client; ``lss.samples`` draws per step, losses
averaged) plus :math:`\\lambda_a\\,\\mathrm{dist}(f_i, f_p) - \\lambda_d \\frac{1}{|M|}
\\sum_{m \\in M}\\mathrm{dist}(f_i, m)` (L2 norms over the trainable parameters, Eqs. 4-5,
the mean over the whole pool including :math:`f_i` itself as written).  Only the new
ingredient is trainable.  The reply is the pool's uniform mean, :math:`f_p` included or
not (``lss.include-anchor``).

**code** form (the official implementation, spec §2.4, without its bugs): the first
ingredient is the received model fine-tuned ``local-epochs`` with a squared pull
:math:`a\\lVert v_0 - \\theta_{init}\\rVert^2`; each later one starts at the mean of the
earlier ones and trains ``max(1, local-epochs // 8)`` epochs on the interpolated loss
minus :math:`d\\,\\mathrm{Vol}^2` of the simplex of all vertices (Cayley-Menger) plus the
same pull, stepping Adam every ``lss.accumulation`` batches with the gradients of those
batches accumulated (the code zeroes them every batch) and the interpolation losses
averaged (the code's division is discarded); the soup leaves :math:`\\theta_{init}` out.

**Defaults.** :math:`\\lambda_a = \\lambda_d = 0.01`, not the paper's 3 (App. E.1): the gradient
of an L2 norm is a unit vector at any distance, so the paper's 3, tuned on ResNet-18's 11M
weights, pins every ingredient of a 0.6M-weight CNN to the received model (spec ``lss.md``
§6 P6: 31.5 % against FedAvg's 80.7 % at R = 1).  0.01 is the pick of a sweep on a tuning
seed, in the pre-trained regime and in ``configs/default.yaml``'s schedule
(``docs/results/lss.md``); the paper's setting is ``lss.affinity=3`` with
``lss.diversity=3``.

BatchNorm running statistics are shared by the pool (updated by every interpolated
forward pass), as in the official code.  The maths is :mod:`fedsys.lss` and
:mod:`fedsys.pool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clients.base import Trainer, TrainJob, TrainResult, batches
from clients.optim import Optimiser
from fedsys.options import option
from fedsys.protocol import TRAINED_EXAMPLES
from fedsys.seeding import derive_seed

if TYPE_CHECKING:
    import torch
    from torch import nn

LSS_TAG = 0x1550


@dataclass(frozen=True)
class LssOptions:
    """Options of the LSS trainer (config keys ``lss.*``)."""

    ingredients: int = option(4, "N: ingredients trained per round (paper: 4; the soup averages "
                              "N + 1 models with the anchor).", bounds=">= 1")
    affinity: float = option(0.01, "lambda_a: weight of the distance to the received model. "
                             "0.01 learns on fedsys's models (swept, docs/results/lss.md); the "
                             "paper's 3 is for an L2 norm over ResNet-18's 11M weights and pins a "
                             "small model to the received one (spec P6). Form code: a, the "
                             "code's 1e-3.", bounds=">= 0")
    diversity: float = option(0.01, "lambda_d: weight of the mean distance to the pool, "
                              "subtracted. 0.01 as lambda_a (the paper's 3: set both to 3). "
                              "Form code: d, weight of the simplex's squared volume, the "
                              "code's 1e-3.", bounds=">= 0")
    samples: int = option(1, "S: interpolations drawn per step, their losses averaged (paper 1, "
                          "code 2).", bounds=">= 1")
    include_anchor: str = option("auto", "Average the received model into the soup: auto = yes "
                                 "for form paper (Alg. 1 line 13), no for code.",
                                 choices=("auto", "yes", "no"))
    form: str = option("paper", "paper: Alg. 1 (L2 affinity and diversity); code: the official "
                       "code's schedule (fine-tune, then simplex vertices, squared pull, "
                       "Cayley-Menger volume), its bugs fixed.", choices=("paper", "code"))
    accumulation: int = option(15, "Form code: batches per Adam step of the later vertices "
                               "(the code's G = 15).", bounds=">= 1")


class Soup:
    """The training state of one client's soup: the model's parameter layout, the data,
    the seeded draws, and the live model's parameters as one vector."""

    def __init__(self, job: TrainJob) -> None:
        import torch

        from fedsys import pool

        self.job, self.cfg = job, job.config
        self.device = torch.device(self.cfg.device)
        self.net: nn.Module = job.net.to(self.device)
        named = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.anchor = pool.trainable_vector(self.net).to(self.device)
        self.gen = torch.Generator().manual_seed(derive_seed(self.cfg.seed, LSS_TAG))
        self.steps = 0
        self.examples = 0
        self.last_loss = 0.0

    def load(self, vector: torch.Tensor) -> None:
        """Set the live model's trainable parameters."""
        import torch

        torch.nn.utils.vector_to_parameters(vector.to(self.device), self.params)

    def views(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """``vector`` as the model's named parameter tensors (views)."""
        out, at = {}, 0
        for n, p in zip(self.names, self.params, strict=True):
            out[n] = vector[at : at + p.numel()].view_as(p)
            at += p.numel()
        return out

    def task_loss(self, frozen: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  samples: int) -> torch.Tensor:
        """Mean cross-entropy at ``samples`` random interpolations of ``frozen`` and the
        live model (only the live model gets gradients)."""
        from torch import nn
        from torch.func import functional_call

        from fedsys import lss, pool

        live = pool.flat(self.params)
        loss = None
        for _ in range(samples):
            if frozen:
                w = lss.simplex_weights(len(frozen) + 1, self.gen)
                f_s = lss.interpolate(frozen, live, w)
            else:
                f_s = live
            out = functional_call(self.net, self.views(f_s), (x,))
            ce = nn.functional.cross_entropy(out, y) / samples
            loss = ce if loss is None else loss + ce
        assert loss is not None
        return loss

    def epochs(self, epochs: int, seed: int) -> Any:
        """Seeded mini-batches (capped by ``local-steps`` per ingredient)."""
        taken = 0
        for epoch, idx in batches(len(self.job.y), self.cfg.batch_size, epochs, seed):
            if self.cfg.max_steps and taken >= self.cfg.max_steps:
                return
            taken += 1
            yield epoch, (self.job.normalise(self.job.x[idx]).to(self.device),
                          self.job.y[idx].to(self.device))

    def optimiser(self) -> Optimiser:
        """A fresh Adam over the live model (coupled weight decay, as the paper's code)."""
        return Optimiser(self.params, "adam", self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def track(self, loss: float, n: int, epoch: int, last: list[int]) -> None:
        """Count steps, examples and the last epoch's mean task loss."""
        if epoch != last[0]:
            last[0], last[1], self.last_loss = epoch, 0, 0.0
        self.last_loss = (self.last_loss * last[1] + loss * n) / (last[1] + n)
        last[1] += n
        self.steps += 1
        self.examples += n


def _mean(vectors: list[torch.Tensor]) -> torch.Tensor:
    """The uniform mean of vectors, one accumulator (summed in order, one division)."""
    import torch

    acc = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v in vectors:
        acc.add_(v)
    return (acc / len(vectors)).to(vectors[0].dtype)


class LssTrainer(Trainer):
    """Local Superior Soups (see the module docstring)."""

    name = "lss"
    Options = LssOptions

    def train(self, job: TrainJob) -> TrainResult:
        """Build the soup from the received model; leave its mean in ``job.net``."""
        import torch

        soup = Soup(job)
        o = job.options
        members, logs = (self._paper if o.form == "paper" else self._code)(soup, o)
        include = o.include_anchor == "yes" or (o.include_anchor == "auto" and o.form == "paper")
        if o.form == "paper" and not include:
            members = members[1:]
        soup.load(_mean(members))
        if not torch.isfinite(torch.tensor(soup.last_loss)):
            raise FloatingPointError("local training diverged (loss is NaN or Inf)")
        return TrainResult(len(job.y), soup.last_loss, soup.steps, metrics={
            "soup-size": len(members), TRAINED_EXAMPLES: soup.examples, **logs})

    @staticmethod
    def _paper(soup: Soup, o: Any) -> tuple[list[torch.Tensor], dict[str, float]]:
        import torch

        from fedsys import pool

        members = [soup.anchor]  # f_p, frozen
        logs: dict[str, float] = {}
        for i in range(1, int(o.ingredients) + 1):
            soup.load(_mean(members))  # Alg. 1 line 4 (f_1 = f_p)
            opt = soup.optimiser()
            last = [-1, 0]
            for epoch, (x, y) in soup.epochs(soup.cfg.epochs, derive_seed(soup.cfg.seed, i)):
                opt.zero_grad(set_to_none=True)
                loss = soup.task_loss(members, x, y, int(o.samples))
                loss.backward()
                with torch.no_grad():
                    theta = pool.flat([p.detach() for p in soup.params])
                    # diversity: the mean over the whole pool, f_i's own zero term
                    # included (1/K, K = i + 1), so the i others get weight i/(i + 1)
                    grad, d_div, d_aff = pool.distance_gradient(
                        theta, members, soup.anchor, float(o.diversity) * i / (i + 1),
                        float(o.affinity))
                    del theta
                    pool.add_to_grads(soup.params, grad)
                opt.step()
                soup.track(float(loss.detach()), len(y), epoch, last)
                logs = {"affinity": d_aff, "diversity": d_div * i / (i + 1)}
            members.append(pool.trainable_vector(soup.net))
        return members, logs

    @staticmethod
    def _code(soup: Soup, o: Any) -> tuple[list[torch.Tensor], dict[str, float]]:
        import torch
        from torch import nn

        from fedsys import lss, pool

        a, d = float(o.affinity), float(o.diversity)
        init = soup.anchor
        opt = soup.optimiser()
        last = [-1, 0]
        for epoch, (x, y) in soup.epochs(soup.cfg.epochs, derive_seed(soup.cfg.seed, 0)):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(soup.net(x), y)
            loss.backward()
            with torch.no_grad():
                theta = pool.flat([p.detach() for p in soup.params])
                pool.add_to_grads(soup.params, torch.sub(theta, init).mul_(2 * a))
            opt.step()
            soup.track(float(loss.detach()), len(y), epoch, last)
        vertices = [pool.trainable_vector(soup.net)]
        logs: dict[str, float] = {}
        g = int(o.accumulation)
        for j in range(1, int(o.ingredients)):
            soup.load(_mean(vertices))
            opt = soup.optimiser()
            opt.zero_grad(set_to_none=True)
            last, pending = [-1, 0], 0
            ep = max(1, soup.cfg.epochs // 8)
            total = -(-len(soup.job.y) // soup.cfg.batch_size) * ep
            if soup.cfg.max_steps:
                total = min(total, soup.cfg.max_steps)
            for b, (epoch, (x, y)) in enumerate(soup.epochs(ep, derive_seed(soup.cfg.seed, j))):
                loss = soup.task_loss(vertices, x, y, int(o.samples))
                (loss / g).backward()
                pending += 1
                soup.track(float(loss.detach()), len(y), epoch, last)
                if pending == g or b == total - 1:
                    with torch.no_grad():
                        theta = pool.flat([p.detach() for p in soup.params])
                        vgrad, vol2 = lss.volume_gradient(theta, vertices)
                        reg = torch.sub(theta, init).mul_(2 * a).add_(vgrad, alpha=-d)
                        del theta, vgrad
                        # the accumulated task gradient is the mean over `pending` batches
                        if pending != g:
                            for p in soup.params:
                                if p.grad is not None:
                                    p.grad.mul_(g / pending)
                        pool.add_to_grads(soup.params, reg)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    pending = 0
                    logs = {"volume2": vol2}
            vertices.append(pool.trainable_vector(soup.net))
        return vertices, logs


__all__ = ["LssOptions", "LssTrainer", "Soup"]
