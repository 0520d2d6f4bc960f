"""Local training: trainers that know nothing of Flower, and their shared SGD loop.

A trainer is a class with a ``name``, its ``Options`` (a frozen dataclass of
:func:`fedsys.options.option` fields, the config keys ``<name>.<option>``) and
:meth:`Trainer.train`, which takes a :class:`TrainJob` (the model already holding
the received weights, the client's data, the round's :class:`LocalConfig`, the typed
options, the node's persisted state and any extra models the server sent) and
returns a :class:`TrainResult` (the trained model stays in ``job.net``; metrics, the
updated state and any extra models to send back).  The ClientApp keeps the state in
Flower's ``context.state``, so it lasts for the run on a SuperNode and in simulation.

This module imports torch only when training runs, so the option declarations can be
read (config validation, ``fedsys keys``) without it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from clients.optim import Optimiser
from fedsys.options import parse_group
from fedsys.params import Params
from fedsys.protocol import TRAINED_EXAMPLES
from fedsys.seeding import seed_torch

if TYPE_CHECKING:
    import torch
    from torch import nn

Normalise = Callable[["torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class LocalConfig:
    """Hyperparameters of one round of local training."""

    epochs: int = 1
    max_steps: int = 0
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    #: ``sgd`` or ``adam`` (the SGD loop's optimiser).
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    #: ``all``, or ``head``: only the classifier layer trains (:func:`run_trainer`).
    trainable: str = "all"
    seed: int = 0
    device: str = "cpu"
    #: Plain cross-entropy epochs before the method's own training (a chain's first hop).
    warmup_epochs: int = 0
    #: Re-initialise the model from this seed before training (-1: keep the received one).
    init_seed: int = -1


def local_config(settings: Mapping[str, Any], base: LocalConfig, seed: int) -> LocalConfig:
    """The round's local-training settings: an instruction's keys (:mod:`fedsys.protocol`:
    ``local-epochs``, ``lr``, ...), else ``base``'s values; ``seed`` is the round's."""
    from fedsys import protocol as proto

    s = settings
    return LocalConfig(
        epochs=int(s.get(proto.LOCAL_EPOCHS, base.epochs)),
        max_steps=int(s.get(proto.LOCAL_STEPS, base.max_steps)),
        batch_size=int(s.get(proto.BATCH_SIZE, base.batch_size)),
        lr=float(s.get(proto.LR, base.lr)),
        momentum=float(s.get(proto.MOMENTUM, base.momentum)),
        optimizer=str(s.get(proto.OPTIMIZER, base.optimizer)),
        weight_decay=float(s.get(proto.WEIGHT_DECAY, base.weight_decay)),
        trainable=str(s.get(proto.TRAINABLE, base.trainable)),
        seed=seed,
        device=base.device,
        warmup_epochs=int(s.get(proto.WARMUP_EPOCHS, base.warmup_epochs)),
        init_seed=int(s.get(proto.INIT_SEED, base.init_seed)),
    )


@dataclass
class TrainJob:
    """Everything one round of local training gets.

    ``state`` is the node's persisted state (empty in its first round): scalars and
    :data:`~fedsys.params.Params` by name.  ``models`` are the extra named models the
    instruction carried (anchors), beside the model already loaded into ``net``.
    """

    net: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    normalise: Normalise
    config: LocalConfig
    options: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Params] = field(default_factory=dict)
    server_round: int = 0
    partition_id: int = 0
    #: The run's seed (``config.seed`` is this round's): what must not change between
    #: rounds, such as a local validation split, derives from it.
    run_seed: int = 0


@dataclass
class TrainResult:
    """What a trainer reports: examples seen per epoch, last-epoch mean loss, steps,
    further metrics (``trained-examples``: every example the training went through, the
    client-training work), the node's new state, and extra models to send back (a pool)."""

    num_examples: int
    train_loss: float
    steps: int
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Params] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """A trainer without options of its own."""


@dataclass(frozen=True)
class BatchSpec:
    """What a trainer's job is, where it can be trained together with others
    (:func:`clients.batched.train_together`): :func:`sgd_loop` on cross-entropy plus
    ``(mu / 2) * ||w - w_received||^2`` over every parameter (FedProx's Eq. 2; ``mu = 0``:
    plain SGD), with the job's :class:`LocalConfig`."""

    mu: float = 0.0


class Trainer(ABC):
    """Base class of fedsys trainers (see the module docstring)."""

    name: ClassVar[str] = "base"
    Options: ClassVar[type] = NoOptions

    def batch_spec(self, job: TrainJob) -> BatchSpec | None:
        """The objective :meth:`train` minimises on ``job``, where it is one that
        :func:`clients.batched.train_together` trains with other clients' jobs in one
        batched computation; None (the default): this job trains alone.  A trainer that
        returns one promises that :meth:`train` is :func:`sgd_loop` with that objective."""
        del job
        return None

    @classmethod
    def prefix(cls) -> str:
        """The config-key prefix of the trainer's options (its name)."""
        return cls.name

    @abstractmethod
    def train(self, job: TrainJob) -> TrainResult:
        """Train ``job.net`` in place; return what happened."""


def trainer_options(trainer: type[Trainer], given: Mapping[str, Any]) -> Any:
    """``trainer``'s typed options from the config keys in ``given`` that carry its prefix
    (``lss.ingredients``); other keys are not its business.

    Raises
    ------
    fedsys.config.ConfigError
        An unknown ``<prefix>.`` key or a value out of bounds, naming it.
    """
    prefix = trainer.prefix()
    return parse_group(trainer.Options, prefix,
                       {k: v for k, v in given.items() if k.startswith(prefix + ".")})


TRAINABLE = ("all", "head")


def run_trainer(trainer: Trainer, job: TrainJob) -> TrainResult:
    """``trainer.train(job)`` with ``job.config.trainable`` applied: ``head`` freezes every
    parameter outside the classifier head (:func:`fedsys.pretrain.head_name`) for the
    training, as the LSS official code does for every method (its ``main.py``, "tmp:
    freezing backbone"); the frozen parameters come back unchanged.

    The trainers seed torch's global generator from the job's seed (dropout, a pool's
    inits); that stays inside: the caller's generator state (CPU, and the job's CUDA
    device) is restored afterwards, so a ClientApp of one's own that calls a fedsys
    trainer draws the same random numbers after it as without it.

    Raises
    ------
    ValueError
        For a ``trainable`` other than ``all`` or ``head``.
    """
    import torch

    kind = job.config.trainable
    if kind not in TRAINABLE:
        raise ValueError(f"trainable {kind!r}; allowed: {', '.join(TRAINABLE)}")
    device = torch.device(job.config.device)
    cuda = [] if device.type != "cuda" else [
        torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=cuda):
        return _train_with(trainer, job, kind)


def _train_with(trainer: Trainer, job: TrainJob, kind: str) -> TrainResult:
    """:func:`run_trainer`'s work, the ``trainable`` kind checked."""
    if kind == "all":
        return trainer.train(job)
    from fedsys.pretrain import head_name

    head = head_name(job.net.state_dict()) + "."
    frozen = [p for n, p in job.net.named_parameters()
              if not n.startswith(head) and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        return trainer.train(job)
    finally:
        for p in frozen:
            p.requires_grad_(True)


def batches(n: int, batch_size: int, epochs: int, seed: int,
            device: torch.device | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(epoch, indices)`` of seeded shuffled mini-batches (drawn on the CPU; with
    ``device``, each epoch's order copied there once and the indices read from it)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        if device is not None:
            perm = perm.to(device)
        for i in range(0, n, batch_size):
            yield epoch, perm[i : i + batch_size]


def sgd_loop(
    net: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    normalise: Normalise,
    cfg: LocalConfig,
    penalty: Callable[[nn.Module], torch.Tensor] | None = None,
) -> TrainResult:
    """Mini-batch SGD (or Adam, ``cfg.optimizer``) on cross-entropy (plus an optional
    penalty term).

    Returns the mean data loss (without the penalty) of the last epoch and, as the
    metric ``trained-examples``, the examples all its steps went through.

    The client's samples are copied to the training device once (as stored), each epoch's
    order once, each batch gathered and normalised there; the batches' losses are read back
    once, at the end (on a GPU no step waits for a copy or a read).
    """
    import torch
    from torch import nn

    device = torch.device(cfg.device)
    net.to(device).train()
    opt = Optimiser(net.parameters(), cfg.optimizer, cfg.lr, momentum=cfg.momentum,
                    weight_decay=cfg.weight_decay)
    seed_torch(cfg.seed)  # dropout and similar layers (torch.manual_seed)
    x, y = x.to(device), y.to(device)
    steps, last_epoch, seen = 0, -1, 0
    epoch_losses: list[tuple[torch.Tensor, int]] = []  # the last epoch's (batch loss, size)
    for epoch, idx in batches(len(y), cfg.batch_size, cfg.epochs, cfg.seed, device):
        if epoch != last_epoch:
            last_epoch, epoch_losses = epoch, []
        xb, yb = normalise(x[idx]), y[idx]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(xb), yb)
        total = loss + penalty(net) if penalty is not None else loss
        total.backward()
        opt.step()
        epoch_losses.append((loss.detach(), len(idx)))
        seen += len(idx)
        steps += 1
        if cfg.max_steps and steps >= cfg.max_steps:
            break
    loss_sum, loss_n = 0.0, 0
    if epoch_losses:  # one read for all, summed in order as the steps came
        values = torch.stack([v for v, _ in epoch_losses]).tolist()
        for value, n in zip(values, (n for _, n in epoch_losses), strict=True):
            loss_sum += value * n
            loss_n += n
    if loss_n and not torch.isfinite(torch.tensor(loss_sum)):
        raise FloatingPointError("local training diverged (loss is NaN or Inf)")
    return TrainResult(len(y), loss_sum / max(loss_n, 1), steps,
                       metrics={TRAINED_EXAMPLES: float(seen)})
