"""Any fedsys trainer inside a Flower Message-API ClientApp: a handler's work in one call.

Flower's app template (``flwr new``, Flower 1.41's PyTorch app) writes a ClientApp whose
``@app.train()`` handler loads the received model, trains it and replies with ``arrays`` and
``metrics`` (``train_loss``, ``num-examples``).  :func:`local_train` is that handler's work
with a fedsys trainer (LSS's soup, FedELMY's diverse pool, FedProx, plain SGD, one of your
own) on your model and data; :func:`local_evaluate` the evaluate handler's::

    from clients import LocalConfig
    from clients.message import local_evaluate, local_train

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x, y = ...                                     # this node's training data, tensors
        return local_train(msg, context, Net(), x, y, trainer="lss",
                           options={"lss.ingredients": 4},
                           local=LocalConfig(epochs=1, batch_size=64, lr=5e-4),
                           partition_id=int(context.node_config["partition-id"]))

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return local_evaluate(msg, Net(), x_val, y_val)

The reply is in Flower's names, so Flower's own strategies (``flwr.serverapp.strategy``)
and fedsys's read it alike.  The round's config (the strategy's ``train_config`` and what it
adds: ``server-round``, and what the method needs) overrides the local settings by the keys
of :mod:`fedsys.protocol` (``lr``, ``local-epochs``, ``batch-size``, ...) and the trainer's
options by their keys (``lss.affinity``).  Without a ``trainer`` argument the strategy's
choice is used: fedsys's FedELMY chain names its trainer (``trainer``), FedProx (Flower's
and fedsys's) sends ``proximal-mu`` (the FedProx trainer, that mu), and otherwise plain
SGD.  A trainer's state between rounds (FedELMY's, your own trainer's) is kept in
``context.state``, as in fedsys's own ClientApp (:mod:`fedsys.trainer_state`).
For Flower's compat API (``NumPyClient``) see :mod:`clients.numpy_client`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from clients import trainer_class
from clients.base import (
    LocalConfig,
    Normalise,
    Trainer,
    TrainJob,
    local_config,
    run_trainer,
    trainer_options,
)
from fedsys import protocol as proto
from fedsys import trainer_state
from fedsys.seeding import derive_seed

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Flower's name of the evaluation loss and accuracy (its app template's)
FLOWER_EVAL_LOSS, FLOWER_EVAL_ACC = "eval_loss", "eval_acc"


def _same(batch: torch.Tensor) -> torch.Tensor:
    return batch


def chosen_trainer(trainer: str | type[Trainer] | None, settings: Mapping[str, Any]
                   ) -> tuple[type[Trainer], dict[str, Any]]:
    """The trainer a round runs and the option keys the instruction implies.

    ``trainer`` when given; else the instruction's ``trainer`` key (fedsys's FedELMY chain's,
    a fedsys run's);
    else FedProx with ``fedprox.mu`` from Flower's ``proximal-mu`` when the instruction
    carries it (Flower's ``FedProx``); else plain SGD.
    """
    if trainer is not None:
        return trainer_class(trainer), {}
    if proto.TRAINER in settings:
        return trainer_class(str(settings[proto.TRAINER])), {}
    if proto.PROXIMAL_MU in settings:
        return trainer_class("fedprox"), {"fedprox.mu": settings[proto.PROXIMAL_MU]}
    return trainer_class("sgd"), {}


def local_train(msg: Message, context: Context, net: nn.Module, x: torch.Tensor,
                y: torch.Tensor, normalise: Normalise | None = None,
                trainer: str | type[Trainer] | None = None, *,
                options: Mapping[str, Any] | None = None, local: LocalConfig | None = None,
                seed: int = 0, partition_id: int | None = None) -> Message:
    """Train ``net`` from the received model with a fedsys trainer; the reply to ``msg``.

    Parameters
    ----------
    msg, context
        The train instruction and the handler's context (its ``state`` keeps the trainer's).
    net
        Your model; it is loaded with the received weights (a strict ``load_state_dict``)
        and trained in place, on ``local.device``.
    x, y
        This node's training data as tensors (raw: ``normalise`` maps a batch to the
        model's input; default: unchanged).
    trainer
        A name in :data:`clients.TRAINERS` or a :class:`~clients.base.Trainer` subclass;
        default: the strategy's choice (see the module docstring).
    options
        The trainer's options by config key (``{"lss.ingredients": 4}``); the round's
        config overrides them.
    local
        Local-training settings (epochs, batch size, lr, optimiser, device); the round's
        config overrides them.
    seed, partition_id
        Each round's draws (batches, a pool's inits) derive from ``(seed, server-round,
        partition_id)``; without ``partition_id``, from the node id.  A given
        ``partition_id`` is reported in the reply (fedsys's strategies key a node's state
        by it).

    Returns
    -------
    Message
        ``arrays`` (the trained weights, on the CPU) and ``metrics`` (``num-examples``,
        ``train_loss``, ``local-steps`` and the trainer's own), plus any extra models the
        trainer sends back as ``model.<name>`` ArrayRecords.

    Raises
    ------
    ValueError
        An unknown trainer, or an option key or value the trainer does not accept (named).
    """
    from fedsys.config import ConfigError

    s = proto.settings(msg.content)
    cls, implied = chosen_trainer(trainer, s)
    try:
        opts = trainer_options(cls, {**implied, **dict(options or {}), **s})
    except ConfigError as exc:
        raise ValueError(f"trainer {cls.name!r}: {exc}") from None
    net.load_state_dict(proto.model_record(msg.content).to_torch_state_dict())
    rnd = int(s.get(proto.SERVER_ROUND, 0))
    who = context.node_id if partition_id is None else partition_id
    scope = f"{s.get(proto.STATE_SCOPE, '')}/{cls.name}"
    job = TrainJob(net.train(), x, y, normalise or _same,
                   local_config(s, local or LocalConfig(), derive_seed(seed, rnd, who)), opts,
                   trainer_state.state_from_records(context.state, scope),
                   proto.extra_models(msg.content), rnd, who, seed)
    res = run_trainer(cls(), job)
    trainer_state.state_to_records(res.state, context.state, scope)
    metrics: dict[str, float | int] = {proto.FLOWER_TRAIN_LOSS: float(res.train_loss),
                                       proto.LOCAL_STEPS: int(res.steps),
                                       **{k: float(v) for k, v in res.metrics.items()}}
    if partition_id is not None:
        metrics[proto.PARTITION_ID] = int(partition_id)
    weights = ArrayRecord({k: v.detach().cpu() for k, v in net.state_dict().items()})
    return proto.train_reply(msg, weights, res.num_examples, metrics, res.models)


def local_evaluate(msg: Message, net: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   normalise: Normalise | None = None, *, batch_size: int = 256,
                   device: str = "cpu") -> Message:
    """Score the received model on ``(x, y)``; the reply to ``msg`` in Flower's names
    (``eval_loss``, ``eval_acc``, ``num-examples``)."""
    import torch

    from fedsys.task import score

    net.load_state_dict(proto.model_record(msg.content).to_torch_state_dict())
    with torch.no_grad():
        loss, acc = score(net, normalise or _same, x, y, batch_size, torch.device(device))
    return Message(RecordDict({proto.METRICS: MetricRecord({
        FLOWER_EVAL_LOSS: float(loss), FLOWER_EVAL_ACC: float(acc),
        proto.NUM_EXAMPLES: len(y)})}), reply_to=msg)


__all__ = ["FLOWER_EVAL_ACC", "FLOWER_EVAL_LOSS", "chosen_trainer", "local_evaluate",
           "local_train"]
