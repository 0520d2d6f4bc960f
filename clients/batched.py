"""Clients of one round trained together: their models stacked, one step for all of them.

:func:`train_together` is :func:`clients.base.sgd_loop` for many clients at once, where
their trainers' objectives are cross-entropy plus a proximal term
(:class:`~clients.base.BatchSpec`: the ``sgd`` and ``fedprox`` trainers) and their
:class:`~clients.base.LocalConfig` agree but for the seed.  Each client's weights are a row
of stacked parameters; a step computes every row's gradient on its own mini-batch in one
call (``torch.func.vmap`` of ``torch.func.functional_call``, differentiated by autograd) and
updates the rows with the same optimiser code as the one-client loop
(:meth:`clients.optim.Optimiser.step_rows`).

Each client keeps what it has alone: its data order and batches (:func:`clients.base.batches`
from its own seed), its number of steps (``epochs`` passes over its own data, ``max-steps``),
its last-epoch loss and ``trained-examples``.  Clients of unequal sizes: a step's batches are
padded to the longest with zero-weight samples (the loss is each client's mean over its real
samples), and the clients are ordered by their number of steps so that those still training
are the first rows: a client that has finished is not in a step any more, its weights and
optimiser state stay exactly as they were.

Not batched (:func:`unbatchable`): a model whose output for one sample depends on the others
of its batch or on random draws (batch norm, dropout), whose one-client training the
stacked form does not reproduce.  The numbers agree with the one-client loop to float
rounding, not to the bit (a padded mean, vmapped kernels): ``tests/unit/test_batched.py``
holds them within 1e-5.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from clients.base import BatchSpec, LocalConfig, TrainJob, TrainResult, batches
from clients.optim import Optimiser
from fedsys.protocol import TRAINED_EXAMPLES

if TYPE_CHECKING:
    import torch
    from torch import nn

State = dict[str, "torch.Tensor"]
#: steps whose batches are read ahead (their indices one copy to the device): bounds the
#: memory the read-ahead holds
PLANNED_STEPS = 256


def steps_of(n: int, cfg: LocalConfig) -> int:
    """The steps :func:`~clients.base.sgd_loop` takes on ``n`` samples: ``cfg.epochs``
    passes of ``ceil(n / batch_size)`` mini-batches, at most ``cfg.max_steps`` (0: no cap)."""
    total = cfg.epochs * math.ceil(n / cfg.batch_size)
    return min(total, cfg.max_steps) if cfg.max_steps else total


def unbatchable(net: nn.Module) -> str | None:
    """Why ``net`` cannot be trained batched (a module that couples a batch's samples or
    draws random numbers in training), or None."""
    from torch import nn

    coupled = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd,
               nn.AlphaDropout, nn.FeatureAlphaDropout)
    for name, module in net.named_modules():
        if isinstance(module, coupled):
            return f"its module {name or '(root)'!r} is a {type(module).__name__}"
    return None


def slower_batched(net: nn.Module, device: str) -> str | None:
    """Why training ``net`` batched on ``device`` is slower than one client at a time
    (``batch-clients: auto`` then trains alone), or None.  Measured
    (``benchmarks/cross_device.py``, ``docs/performance.md``): on the CPU a convolution of
    stacked models runs as a grouped convolution, about twice the time of the clients'
    convolutions one after another (the FMNIST CNN); matrix products batch well."""
    from torch import nn

    if device.startswith("cuda"):
        return None
    for name, module in net.named_modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return f"its module {name!r} is a convolution, on the CPU"
    return None


def shares(n: int, parts: int) -> list[range]:
    """Rows ``0 .. n-1`` cut into at most ``parts`` contiguous shares whose sizes differ by
    at most one (the first ``n % parts`` are the larger), none empty: 100 clients on 4
    devices, 25 each."""
    size, extra = divmod(n, max(parts, 1))
    out, start = [], 0
    for g in range(max(parts, 1)):
        end = start + size + (1 if g < extra else 0)
        if end > start:
            out.append(range(start, end))
        start = end
    return out


def devices_for(device: str) -> list[str]:
    """The devices a round's batched clients are spread over: every visible GPU for
    ``cuda`` (no index given), else ``device`` alone."""
    import torch

    if device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]


def train_on_devices(net: nn.Module, starts: Sequence[State], jobs: Sequence[TrainJob],
                     specs: Sequence[BatchSpec], devices: Sequence[str]
                     ) -> list[tuple[TrainResult | FloatingPointError, State]]:
    """:func:`train_together` on each device's :func:`shares` of the jobs, all devices at
    once (a thread each, with its own copy of ``net``: torch's kernels run without the
    GIL), the results in the jobs' order.  One device: :func:`train_together` itself.  The
    shares train as separate batches, so the numbers differ from one device's by float
    rounding."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    if len(devices) <= 1:
        return train_together(net, starts, jobs, specs)

    def share(device: str, rows: range) -> list[tuple[TrainResult | FloatingPointError, State]]:
        mine = [dataclasses.replace(jobs[i], config=dataclasses.replace(jobs[i].config, device=device))
                for i in rows]
        return train_together(copy.deepcopy(net), [starts[i] for i in rows], mine,
                              [specs[i] for i in rows])

    cuts = shares(len(jobs), len(devices))
    with ThreadPoolExecutor(len(cuts), thread_name_prefix="fedsys-device") as pool:
        parts = list(pool.map(share, devices[: len(cuts)], cuts))
    return [r for part in parts for r in part]


def group_key(cfg: LocalConfig) -> LocalConfig:
    """What jobs trained together must share: their local configuration but the seed."""
    return dataclasses.replace(cfg, seed=0)


def train_together(net: nn.Module, starts: Sequence[State], jobs: Sequence[TrainJob],
                   specs: Sequence[BatchSpec]) -> list[tuple[TrainResult | FloatingPointError, State]]:
    """Train every job's client from its ``starts`` weights, all in one batched loop.

    Parameters
    ----------
    net : nn.Module
        The model (its structure: its own weights are not used nor changed but moved to
        the jobs' device).
    starts : sequence of dict
        Each client's received weights (``net``'s state-dict keys).
    jobs : sequence of TrainJob
        Each client's data, normalisation and local configuration (``group_key`` equal).
    specs : sequence of BatchSpec
        Each client's objective (its proximal ``mu``).

    Returns
    -------
    list of (TrainResult or FloatingPointError, dict)
        Per job, in order: what :func:`~clients.base.sgd_loop` would report (or the error
        it would raise for a loss that is NaN or Inf), and the trained weights (on the
        CPU, rows of one stacked tensor per name; what was not trained is ``starts``'s).

    Raises
    ------
    ValueError
        Jobs whose configurations differ, or a model :func:`unbatchable` refuses.
    """
    import torch
    from torch.func import functional_call, vmap
    from torch.nn import functional as func

    if not jobs or not len(jobs) == len(starts) == len(specs):
        raise ValueError("train_together needs one start and one spec per job, and a job")
    cfg = jobs[0].config
    if any(group_key(j.config) != group_key(cfg) for j in jobs):
        raise ValueError("jobs trained together must share their local configuration")
    if why := unbatchable(net):
        raise ValueError(f"the model cannot be trained batched: {why}")
    device = torch.device(cfg.device)
    net.to(device)
    params = [n for n, _ in net.named_parameters()]
    if cfg.trainable == "head":
        from fedsys.pretrain import head_name

        head = head_name(starts[0]) + "."
        trained = [n for n in params if n.startswith(head)]
    else:
        trained = params
    fixed = [k for k in starts[0] if k not in trained]  # frozen parameters, buffers
    steps = [steps_of(len(j.y), cfg) for j in jobs]
    order = sorted(range(len(jobs)), key=lambda i: -steps[i])  # those training first

    def stacked(names: list[str]) -> State:
        """The clients' tensors of each name stacked on the device, each distinct tensor
        copied there once (a round's broadcast model is one tensor shared by every
        client's start: one copy to a GPU, not one per client)."""
        out = {}
        for n in names:
            moved: dict[int, torch.Tensor] = {}
            for i in order:
                t = starts[i][n]
                if id(t) not in moved:
                    moved[id(t)] = t.detach().to(device)
            out[n] = torch.stack([moved[id(starts[i][n])] for i in order])
        return out

    weights, rest = stacked(trained), stacked(fixed)
    dtype = next(iter(weights.values())).dtype
    mus = torch.tensor([specs[i].mu for i in order], dtype=dtype, device=device)
    proximal = bool((mus != 0).any())
    anchor = {n: w.clone() for n, w in weights.items()} if proximal else {}
    opt = Optimiser(list(weights.values()), cfg.optimizer, cfg.lr, momentum=cfg.momentum,
                    weight_decay=cfg.weight_decay)

    def loss(w: State, other: State, a: State, mu: torch.Tensor, x: torch.Tensor,
             y: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One client's objective on its batch, and its data loss."""
        out = functional_call(net, {**w, **other}, (x,))
        data = (func.cross_entropy(out, y, reduction="none") * keep).sum() / keep.sum()
        if not proximal:
            return data, data
        sq = sum(((w[n] - a[n]) ** 2).sum() for n in w)
        return data + 0.5 * mu * sq, data

    # every client's objective at once; the gradient of their sum with respect to the
    # stacked weights is each client's own gradient in its row (a row's objective reads
    # only that row).  Plain autograd, not torch.func.grad: that one imports torch._dynamo
    # (seconds of CPU, 150 MB) on its first call.
    losses = vmap(loss)

    def step(w: State, other: State, a: State, mu: torch.Tensor, x: torch.Tensor,
             y: torch.Tensor, keep: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        leaves = {n: v.detach().requires_grad_(True) for n, v in w.items()}
        with torch.enable_grad():
            objective, data = losses(leaves, other, a, mu, x, y, keep)
            grads = torch.autograd.grad(objective.sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), data
    rows = len(jobs)
    loss_sum = torch.zeros(rows, dtype=torch.float64, device=device)
    loss_n, seen, last_epoch = [0] * rows, [0] * rows, [-1] * rows
    feeds = [batches(len(jobs[i].y), cfg.batch_size, cfg.epochs, jobs[i].config.seed)
             for i in order]
    shared = all(j.normalise == jobs[0].normalise for j in jobs)
    # one normalisation: every client's samples in one pool, a step's batches read from it
    # by one index (a padded place reads the pool's first sample, masked out of the loss)
    pool = _Pool([jobs[i] for i in order], device) if shared else None
    total, done = max(steps, default=0), 0
    while done < total:
        # the next steps' batches read from the clients' feeds first (which rows start an
        # epoch at each step, each step's indices), so that the pool's indices for all of
        # them cross to the device in one copy: a step then waits for no copy
        plan: list[tuple[int, list[int], list[torch.Tensor]]] = []
        for t in range(done, min(done + PLANNED_STEPS, total)):
            live = sum(1 for i in order if steps[i] > t)
            fresh, idxs = [], []
            for r in range(live):
                epoch, idx = next(feeds[r])
                if epoch != last_epoch[r]:
                    last_epoch[r], loss_n[r] = epoch, 0
                    fresh.append(r)
                idxs.append(idx)
                loss_n[r] += len(idx)
                seen[r] += len(idx)
            plan.append((live, fresh, idxs))
        done += len(plan)
        gathered = pool.schedule([idxs for *_, idxs in plan]) if pool is not None else None
        for k, (live, fresh, idxs) in enumerate(plan):
            for r in fresh:
                loss_sum[r].fill_(0.0)  # on the device, no copy from the host
            if pool is not None and gathered is not None:  # one call for the step's samples
                where, keep = gathered[k]
                xs, ys = pool.x[where], pool.y[where]
                xs = jobs[0].normalise(xs.flatten(0, 1)).unflatten(0, xs.shape[:2])
            else:
                mine = [jobs[order[r]] for r in range(live)]  # each its own normalisation
                xs, ys, keep = _padded([(j.normalise(j.x[idx]), j.y[idx])
                                        for j, idx in zip(mine, idxs, strict=True)])
            keep = keep.to(xs.dtype)
            sizes = keep.sum(1).to(device, torch.float64)
            view = {n: w[:live] for n, w in weights.items()}
            grads, data = step(view, {n: v[:live] for n, v in rest.items()},
                               {n: v[:live] for n, v in anchor.items()}, mus[:live],
                               xs.to(device), ys.to(device), keep.to(device))
            opt.step_rows(live, [grads[n] for n in trained])
            loss_sum[:live] += data.detach().to(torch.float64) * sizes
    sums = loss_sum.tolist()
    # the stacks back on the host in one copy each (on the CPU: themselves), a client's
    # weights a row of them
    host = {k: v.cpu() for k, v in (weights | rest).items()}
    out: list[tuple[TrainResult | FloatingPointError, State]] = [None] * rows  # type: ignore[list-item]
    for r, i in enumerate(order):
        state = {k: host[k][r] for k in starts[i]}
        result: TrainResult | FloatingPointError
        if loss_n[r] and not math.isfinite(sums[r]):
            result = FloatingPointError("local training diverged (loss is NaN or Inf)")
        else:
            result = TrainResult(len(jobs[i].y), sums[r] / max(loss_n[r], 1), steps[i],
                                 metrics={TRAINED_EXAMPLES: float(seen[r])})
        out[i] = (result, state)
    return out


class _Pool:
    """The samples of a round's clients in one tensor on the training device, row ``r``'s
    from ``starts[r]`` on: copied there once a round (as stored, ``uint8`` images), so that
    a step's batches are gathered and normalised there, with only the steps' indices
    crossing over, many steps' in one copy (:meth:`schedule`)."""

    def __init__(self, jobs: Sequence[TrainJob], device: torch.device) -> None:
        import torch

        self.x = torch.cat([j.x for j in jobs]).to(device)
        self.y = torch.cat([j.y for j in jobs]).to(device)
        self.starts = [0, *itertools.accumulate(len(j.y) for j in jobs[:-1])]

    def schedule(self, steps: list[list[torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each step (row ``r``: the indices ``steps[t][r]`` of its client's samples) the
        places of its batches in the pool, padded to the longest, and the mask of real
        samples (1) among them: on the pool's device, all steps' in one copy of each."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        wheres, keeps = [], []
        for idxs in steps:
            where = pad_sequence([i + s for i, s in zip(idxs, self.starts, strict=False)],
                                 batch_first=True)
            lengths = torch.tensor([len(i) for i in idxs])
            wheres.append(where)
            keeps.append((torch.arange(where.shape[1]) < lengths[:, None]).to(torch.float32))
        flat_where = torch.cat([w.flatten() for w in wheres]).to(self.x.device)
        flat_keep = torch.cat([k.flatten() for k in keeps]).to(self.x.device)
        out, at = [], 0
        for where, keep in zip(wheres, keeps, strict=True):
            n = where.numel()
            out.append((flat_where[at : at + n].view(where.shape),
                        flat_keep[at : at + n].view(keep.shape)))
            at += n
        return out


def _padded(picked: list[tuple[torch.Tensor, torch.Tensor]]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's batches ``(x, y)`` stacked, each padded with zeros to the longest, and
    the mask of real samples (1) among them."""
    import torch

    longest = max(len(y) for _, y in picked)
    if all(len(y) == longest for _, y in picked):
        return (torch.stack([x for x, _ in picked]), torch.stack([y for _, y in picked]),
                torch.ones((len(picked), longest)))
    x0, y0 = picked[0]
    xs = x0.new_zeros((len(picked), longest, *x0.shape[1:]))
    ys = y0.new_zeros((len(picked), longest))
    keep = torch.zeros((len(picked), longest))
    for r, (x, y) in enumerate(picked):
        xs[r, : len(y)], ys[r, : len(y)], keep[r, : len(y)] = x, y, 1.0
    return xs, ys, keep
