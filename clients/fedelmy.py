"""FedELMY's diverse local model pool, and FedSeq's plain sequential local training.

FedELMY (Wang et al., ACM MM 2024, Alg. 1 lines 8-19; spec ``fedelmy.md`` §2.4): the
pool starts with the received model :math:`m_0`; ``fedelmy.pool-size`` (S) more
models each start at the pool's uniform mean (Eq. 6) and train ``local-epochs``
epochs on Eq. 9, d1 and d2 divided by App. A's magnitude factor (one decade below
the loss; ``fedelmy.scaling: false`` for the unscaled ablation), with a fresh Adam
(coupled weight decay, as the paper's code); each keeps its best-validation epoch (a
seeded ``val-fraction`` local split, App. A);
the reply is the uniform mean of the S + 1 pool models, BatchNorm buffers included
(Eq. 5).  The maths is :mod:`fedsys.fedelmy` and :mod:`fedsys.pool`.

FedSeq (Li & Lyu 2024, the paper's SFL baseline; spec §6.16): the same Adam training
with best-validation selection, one model, sent as trained.

Both honour the instruction's ``warmup-epochs`` (plain cross-entropy epochs first,
the chain's first hop, Alg. 1 line 1) and ``init-seed`` (start from an own random
model: the parallel variant, Alg. 3).  ``local-steps`` caps each model's steps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clients.base import Trainer, TrainJob, TrainResult, batches
from clients.optim import Optimiser
from fedsys.fedelmy import GRAD_RATIO, POOL_HELD, pool_held
from fedsys.options import option
from fedsys.params import Params, RunningMean, from_torch, to_torch
from fedsys.protocol import TRAINED_EXAMPLES
from fedsys.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    import torch
    from torch import nn

VAL_TAG = 0x7A11
WARMUP_TAG = 0x3A4B
#: what :class:`Regulariser` logs per step: d1, d2, s, the norms of the regulariser's
#: gradient (``pull``) and of the loss's (``loss-grad``); a pool model's ``logs`` are its
#: last epoch's means, the two norms as their ratio ``grad-ratio``
REG_LOGS = ("d1", "d2", "scale", "pull", "loss-grad")


@dataclass(frozen=True)
class FedSeqOptions:
    """Options of FedSeq's local training (config keys ``fedseq.*``)."""

    val_fraction: float = option(
        0.1, "Share of the client's data held out (seeded, the same every hop) for choosing "
        "the best epoch (paper App. A: 10 %).", bounds="[0, 1)")
    select_best: bool = option(
        True, "Keep the epoch with the best local validation accuracy (paper App. A); "
        "false: the last epoch.")


@dataclass(frozen=True)
class FedElmyOptions(FedSeqOptions):
    """Options of the FedELMY pool trainer (config keys ``fedelmy.*``)."""

    pool_size: int = option(5, "S: models trained per client besides the received one "
                            "(pool of S + 1; paper: 5 on CIFAR-10, 10 on PACS).", bounds=">= 1")
    alpha: float = option(0.06, "Weight of the diversity distance d1, subtracted (Eq. 9; "
                          "paper CIFAR-10: 0.06).", bounds=">= 0")
    beta: float = option(1.0, "Weight of the proximity distance d2 to the received model "
                         "(Eq. 9).", bounds=">= 0")
    form: str = option("paper", "paper: L2 norms, pairwise d1 (Eqs. 7-8); code: the official "
                       "code's squared L2 with the start as extra anchor, closed-form "
                       "gradient (spec §2.2).", choices=("paper", "code"))
    scaling: bool = option(True, "App. A's logarithmic magnitude scaling: d1 and d2 divided by "
                           "s = SCALE(loss, d2), one decade below the loss (spec §2.2; part of "
                           "the paper's method, both forms); false: the unscaled Eq. 9, an "
                           "ablation.")


@dataclass
class Fit:
    """One model's training: its kept state and what happened."""

    state: Params
    best_acc: float
    last_loss: float
    steps: int
    examples: int
    logs: dict[str, float] = field(default_factory=dict)


def split_validation(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ``(train, validation)`` index tensors: the first ``int(fraction * n)``
    of a permutation (at least one when ``fraction > 0`` and ``n >= 2``) validate."""
    import torch

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = int(fraction * n)
    if fraction > 0 and n >= 2:
        k = max(k, 1)
    return perm[k:], perm[:k]


class Regulariser:
    """Eq. 9's extra terms for one pool model (see :mod:`fedsys.fedelmy`)."""

    def __init__(self, form: str, scaling: bool, alpha: float, beta: float,
                 m0: torch.Tensor, start: torch.Tensor, pool: list[torch.Tensor]) -> None:
        self.form, self.scaling, self.alpha, self.beta = form, scaling, alpha, beta
        self.m0, self.start, self.pool = m0, start, pool
        self.logs: dict[str, float] = {}

    def after_backward(self, params: Sequence[torch.Tensor], ce: torch.Tensor) -> None:
        """Add the regulariser's gradient (closed form, both forms) to ``.grad``; the
        factor ``s`` comes from this batch's loss and d2 (both detached)."""
        import torch

        from fedsys import fedelmy as fe
        from fedsys import pool as pool_ops

        with torch.no_grad():
            ce_norm = math.sqrt(sum(float(torch.linalg.vector_norm(p.grad)) ** 2
                                    for p in params if p.grad is not None))
            theta = pool_ops.flat([p.detach() for p in params])
            loss = float(ce.detach())
            if self.form == "code":
                d2 = float(torch.sub(theta, self.m0).pow_(2).sum())
                s = fe.magnitude_scale(loss, d2) if self.scaling else 1.0
                grad = fe.code_gradient(theta, self.m0, self.start, self.alpha, self.beta, s)
                d1 = float(torch.sub(theta, self.start).pow_(2).sum())  # up to a constant
            else:
                d2 = float(torch.linalg.vector_norm(theta - self.m0)) if self.scaling else 0.0
                s = fe.magnitude_scale(loss, d2) if self.scaling else 1.0
                grad, d1, d2 = pool_ops.distance_gradient(theta, self.pool, self.m0, self.alpha,
                                                 self.beta, s)
            del theta
            pull = float(torch.linalg.vector_norm(grad))
            pool_ops.add_to_grads(params, grad)
            self.logs = {"d1": d1, "d2": d2, "scale": s, "pull": pull, "loss-grad": ce_norm}


def train_one(net: nn.Module, job: TrainJob, data: tuple[torch.Tensor, ...], epochs: int,
              seed: int, select_best: bool, reg: Regulariser | None = None) -> Fit:
    """Alg. 1's TRAIN_ONE (spec §2.4): ``epochs`` of Adam (fresh, coupled weight decay)
    on cross-entropy (plus ``reg``), keeping the best-validation epoch (strict ``>``;
    the last epoch when none scores above 0 or there is no validation data)."""
    import torch
    from torch import nn

    from fedsys import pool as pool_ops
    from fedsys.task import score

    x, y, xv, yv = data
    cfg = job.config
    device = torch.device(cfg.device)
    net.to(device)
    params = pool_ops.trainable_params(net)
    opt = Optimiser(params, "adam", cfg.lr, weight_decay=cfg.weight_decay)
    seed_torch(seed)
    best: Params | None = None
    best_acc, last_loss, steps, examples = 0.0, 0.0, 0, 0
    logs: dict[str, float] = {}
    for epoch in range(epochs):
        net.train()
        loss_sum, n, sums = 0.0, 0, dict.fromkeys(REG_LOGS, 0.0)
        for _, idx in batches(len(y), cfg.batch_size, 1, derive_seed(seed, epoch)):
            xb, yb = job.normalise(x[idx]).to(device), y[idx].to(device)
            opt.zero_grad(set_to_none=True)
            ce = nn.functional.cross_entropy(net(xb), yb)
            ce.backward()
            if reg is not None:
                reg.after_backward(params, ce)
                for k in sums:
                    sums[k] += reg.logs.get(k, 0.0) * len(idx)
            opt.step()
            loss_sum += float(ce.detach()) * len(idx)
            n += len(idx)
            steps += 1
            if cfg.max_steps and steps >= cfg.max_steps:
                break
        examples += n
        last_loss = loss_sum / max(n, 1)
        if not torch.isfinite(torch.tensor(last_loss)):
            raise FloatingPointError("local training diverged (loss is NaN or Inf)")
        if reg is not None:
            logs = {k: v / max(n, 1) for k, v in sums.items()}
            pull, loss_grad = logs.pop("pull"), logs.pop("loss-grad")
            logs[GRAD_RATIO] = pull / loss_grad if loss_grad > 0 else 0.0  # nothing to learn
        if select_best and len(yv):
            _, acc = score(net, job.normalise, xv, yv, 512, device)
            if acc > best_acc:
                best_acc, best = acc, from_torch(net.state_dict())
        if cfg.max_steps and steps >= cfg.max_steps:
            break
    if best is None:
        best = from_torch(net.state_dict())
        if len(yv):
            _, best_acc = score(net, job.normalise, xv, yv, 512, device)
    return Fit(best, best_acc, last_loss, steps, examples, logs)


def _prepare(job: TrainJob, options: Any) -> tuple[tuple[torch.Tensor, ...], list[Fit]]:
    """Validation split, own initialisation and the warm-up (a chain's first hop)."""

    tr, va = split_validation(len(job.y), float(options.val_fraction),
                              derive_seed(job.run_seed, job.partition_id, VAL_TAG))
    data = (job.x[tr], job.y[tr], job.x[va], job.y[va])
    if job.config.init_seed >= 0:
        seed_torch(job.config.init_seed)
        for m in job.net.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()
    fits: list[Fit] = []
    if job.config.warmup_epochs > 0:
        fit = train_one(job.net, job, data, job.config.warmup_epochs,
                        derive_seed(job.config.seed, WARMUP_TAG), bool(options.select_best))
        job.net.load_state_dict(to_torch(fit.state))
        fit.state = {}  # in the model now: no copy kept
        fits.append(fit)
    return data, fits


def _result(data: tuple[torch.Tensor, ...], fits: list[Fit], extra: dict[str, float]) -> TrainResult:
    last = fits[-1]
    return TrainResult(
        num_examples=len(data[1]), train_loss=last.last_loss, steps=sum(f.steps for f in fits),
        metrics={"val-acc": last.best_acc, TRAINED_EXAMPLES: sum(f.examples for f in fits),
                 **extra})


class FedSeqTrainer(Trainer):
    """FedSeq's local training: Adam, best-validation epoch, the trained model sent."""

    name = "fedseq"
    Options = FedSeqOptions

    def train(self, job: TrainJob) -> TrainResult:
        """Warm up if asked, train ``local-epochs``, keep the best-validation epoch."""
        data, fits = _prepare(job, job.options)
        if job.config.epochs > 0 or not fits:
            fit = train_one(job.net, job, data, job.config.epochs, job.config.seed,
                            bool(job.options.select_best))
            job.net.load_state_dict(to_torch(fit.state))
            fit.state = {}
            fits.append(fit)
        return _result(data, fits, {})


class FedElmyTrainer(Trainer):
    """FedELMY's local model pool (Alg. 1 lines 8-19); see the module docstring."""

    name = "fedelmy"
    Options = FedElmyOptions

    def train(self, job: TrainJob) -> TrainResult:
        """Build the pool from the received model; leave its uniform mean in ``job.net``."""
        from fedsys import pool as pool_ops

        o = job.options
        data, fits = _prepare(job, o)
        device = job.config.device
        m0 = pool_ops.trainable_vector(job.net).to(device)
        pool = RunningMean()
        pool.add(from_torch(job.net.state_dict()))
        anchors = [m0]  # paper form: every pool model's trainable vector (d1 is pairwise)
        for j in range(1, int(o.pool_size) + 1):
            job.net.load_state_dict(to_torch(pool.mean()))  # Eq. 6
            start = pool_ops.trainable_vector(job.net).to(device)
            reg = Regulariser(o.form, bool(o.scaling), float(o.alpha), float(o.beta), m0,
                              start, anchors)
            fit = train_one(job.net, job, data, job.config.epochs,
                            derive_seed(job.config.seed, j), bool(o.select_best), reg)
            pool.add(fit.state)
            if o.form == "paper" and j < int(o.pool_size):
                job.net.load_state_dict(to_torch(fit.state))
                anchors.append(pool_ops.trainable_vector(job.net).to(device))
            fit.state = {}  # in the running mean (and an anchor): no copy kept
            fits.append(fit)
            del start, reg
        job.net.load_state_dict(to_torch(pool.mean()))  # Eq. 5: the reply
        last = fits[-1].logs
        pool_fits = fits[-int(o.pool_size):]
        ratio = sum(f.logs.get(GRAD_RATIO, 0.0) for f in pool_fits) / len(pool_fits)
        held = pool_held(ratio, [f.logs.get("scale", 0.0) for f in pool_fits])
        if held:
            _warn_held(ratio, pool_fits, job.partition_id, o)
        return _result(data, fits, {"pool-size": pool.count, GRAD_RATIO: ratio,
                                    POOL_HELD: float(held),
                                    **{f"last-{k}": v for k, v in last.items()}})


def _warn_held(ratio: float, pool_fits: list[Fit], who: int, o: Any) -> None:
    """One WARNING: the pool stayed near the received model (:func:`fedsys.fedelmy.pool_held`)."""
    d2 = max(f.logs.get("d2", 0.0) for f in pool_fits)
    loss = pool_fits[-1].last_loss
    decade = 10.0 ** math.floor(math.log10(loss)) if loss > 0 and math.isfinite(loss) else 0.0
    if not o.scaling:  # the ablation: s is 1 by construction (and the code form logs no d2)
        logging.getLogger("flwr").warning(
            "fedelmy (client %s): the distance terms' gradient is %.2g times the loss's (the "
            "pool's mean): its models stay near the received model and learn little (last loss "
            "%.3g); without App. A's scaling (fedelmy.scaling is false) Eq. 9's pull has norm "
            "beta = %g at any distance.  fedelmy.scaling: true (the default) or a lower "
            "fedelmy.beta lets them move", who, ratio, loss, float(o.beta))
        return
    logging.getLogger("flwr").warning(
        "fedelmy (client %s): the distance terms' gradient is %.2g times the loss's (the pool's "
        "mean): its models stay within d2 = %.3g of the received model and learn little (last "
        "loss %.3g); Eq. 9's pull has norm beta/s = %g/%g there (App. A's s stays 1 until d2 "
        "reaches %g, the loss's decade).  On a small model lower fedelmy.beta (docs/methods.md: "
        "'FedELMY's pool on a small model')", who, ratio, d2, loss, float(o.beta),
        pool_fits[-1].logs.get("scale", 1.0), decade)


__all__ = ["FedElmyOptions", "FedElmyTrainer", "FedSeqOptions", "FedSeqTrainer", "Fit",
           "Regulariser", "split_validation", "train_one"]
