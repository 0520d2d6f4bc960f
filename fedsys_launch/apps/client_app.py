"""The fedsys ClientApp (``[tool.flwr.app.components] clientapp``).

It reads its partition from ``node_config`` (``partition-id``, ``num-partitions``
and, in deployment, ``data-dir``), trains with the trainer the instruction names
(typed settings and the trainer's options from the instruction, the run config
filling in), keeps the trainer's state in ``context.state`` across rounds, and
replies as :mod:`fedsys.protocol` says.

Before it reads data or imports a plugin it admits the run config
(:class:`~fedsys_launch.apps.admission.Admission`)
under a policy (:mod:`fedsys.confine`): :data:`app`, the one Flower loads, under the site
operator's (``FEDSYS_ROOTS``, ``FEDSYS_PLUGINS``, the node config's ``data-dir`` allowed);
the app :func:`fedsys_launch.engines.simulation.simulate` builds (:func:`make_app`) under the policy
of the run's own config (:func:`fedsys.confine.own_run_policy`).  The model it trains is
:mod:`fedsys_launch.apps.node_model`'s, an attacker's part :mod:`fedsys_launch.apps.attack_injection`'s;
the in-process engine trains many nodes' instructions together through the same read and
reply (:class:`fedsys_launch.engines.batch_training.BatchTraining`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from clients import LocalConfig, Trainer, TrainJob, TrainResult, trainer_class
from clients.base import local_config, run_trainer, trainer_options
from fedsys import attacks, confine, trainer_state
from fedsys import protocol as proto
from fedsys.config import ConfigError, RunConfig
from fedsys.data import Dataset
from fedsys.dp import clip_update
from fedsys.seeding import derive_seed
from fedsys.task import client_data, dataset, evaluate, pick_device
from fedsys_launch.apps import node_model
from fedsys_launch.apps.admission import Admission
from fedsys_launch.apps.attack_injection import (
    attack_of,
    attacked_reply,
    claimed_size,
    poisoned_labels,
)


def _partition_id(context: Context) -> int:
    nc = context.node_config
    if proto.PARTITION_ID not in nc:
        raise ValueError(
            f"node_config lacks '{proto.PARTITION_ID}'; start the SuperNode with "
            f"--node-config \"{proto.PARTITION_ID}=I {proto.NUM_PARTITIONS}=N\"")
    return int(nc[proto.PARTITION_ID])


def _node(context: Context, admission: Admission | None
          ) -> tuple[RunConfig, Dataset, int, int, torch.Tensor, torch.Tensor]:
    nc = context.node_config
    node_dir = str(nc["data-dir"]) if "data-dir" in nc else None
    overrides = {"data-dir": node_dir} if node_dir is not None else {}
    cfg = (admission or Admission())({**context.run_config, **overrides}, node_dir)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    pid = _partition_id(context)
    # a site with its own data (a data-dir, no num-partitions) trains on all of it; its
    # partition-id is then only its identity (seeds, the server's sampling)
    own = node_dir is not None and proto.NUM_PARTITIONS not in nc
    nparts = 1 if own else int(nc.get(proto.NUM_PARTITIONS, cfg.num_clients))
    if not own and not 0 <= pid < nparts:
        raise ValueError(f"{proto.PARTITION_ID} {pid} outside 0..{nparts - 1}")
    ds = dataset(cfg)
    x, y = client_data(cfg, 0 if own else pid, nparts)
    return cfg, ds, pid, nparts, x, y


def run_local_config(cfg: RunConfig, s: dict[str, Any], seed: int) -> LocalConfig:
    """The round's local-training settings: the instruction's, else the run config's."""
    return local_config(s, LocalConfig(
        epochs=cfg.local_epochs, max_steps=cfg.local_steps, batch_size=cfg.batch_size,
        lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, optimizer=cfg.optimizer,
        trainable=cfg.trainable,
        device=str(pick_device(cfg.device))), seed)


@dataclass
class TrainCall:
    """One train instruction as the ClientApp has read it, up to the training itself:
    :func:`train` is :func:`train_call`, :func:`clients.base.run_trainer` on ``job``, then
    :func:`train_reply`; the in-process engine trains the jobs of many calls together in
    between (:class:`fedsys_launch.engines.batch_training.BatchTraining`)."""

    msg: Message
    cfg: RunConfig
    ds: Dataset
    pid: int
    nparts: int
    rnd: int
    settings: dict[str, Any]
    attack: attacks.AttackOptions | None
    trainer: Trainer
    scope: str
    job: TrainJob


def train_call(msg: Message, context: Context, load: bool = True,
               admission: Admission | None = None) -> TrainCall:
    """Read ``msg`` on this node: its run config admitted by ``admission`` (default: under
    the operator's policy), its data (flipped labels for a label-flip attacker), the
    trainer and its options, the model holding the instruction's weights (``job.net``, the
    process's model: the next call overwrites it; with ``load`` false the model as the last
    call left it) and the node's state."""
    cfg, ds, pid, nparts, x, y = _node(context, admission)
    s = proto.settings(msg.content)
    rnd = int(s.get(proto.SERVER_ROUND, 0))
    attack = attack_of(cfg, pid, nparts, rnd)
    y = poisoned_labels(attack, y, ds.num_classes)
    name = str(s.get(proto.TRAINER, "sgd"))
    trainer = trainer_class(name)
    try:
        options = trainer_options(trainer, {**cfg.group(trainer.prefix()), **s})
    except ConfigError as exc:
        raise ValueError(f"trainer {name!r}: {exc}") from None
    scope = f"{s.get(proto.STATE_SCOPE, '')}/{name}"
    net = (node_model.load_model(cfg, ds, msg) if load else
           node_model.built_model(cfg.model, ds.input_shape, ds.num_classes, cfg.seed,
                                  cfg.model_norm))
    job = TrainJob(net, x, y, ds.normalise, run_local_config(cfg, s, derive_seed(cfg.seed, rnd, pid)),
                   options, trainer_state.state_from_records(context.state, scope),
                   proto.extra_models(msg.content), rnd, pid, cfg.seed)
    return TrainCall(msg, cfg, ds, pid, nparts, rnd, s, attack, trainer(), scope, job)


def train_reply(call: TrainCall, res: TrainResult, weights: ArrayRecord, context: Context) -> Message:
    """The reply to ``call`` whose training reported ``res`` and ended at ``weights``: the
    trainer's state kept in ``context``, the update clipped for client-side DP, an
    attacker's reply in place of the honest one."""
    msg, s = call.msg, call.settings
    trainer_state.state_to_records(res.state, context.state, call.scope)
    if proto.DP_CLIPPING_NORM in s:  # client-side DP: the update clipped before it leaves
        sent = proto.from_record(proto.model_record(msg.content))
        clipped, _ = clip_update(proto.from_record(weights), sent, float(s[proto.DP_CLIPPING_NORM]))
        weights = proto.to_record(clipped)
    num_examples = res.num_examples
    if call.attack is not None:
        weights, num_examples = attacked_reply(call.attack, call.cfg, call.ds, msg, weights, num_examples,
                                          derive_seed(call.cfg.seed, call.rnd, call.pid))
    return proto.train_reply(
        msg, weights, num_examples,
        {proto.PARTITION_ID: call.pid, proto.TRAIN_LOSS: res.train_loss,
         proto.LOCAL_STEPS: res.steps, **res.metrics},
        res.models,
    )


def train(msg: Message, context: Context, admission: Admission | None = None) -> Message:
    """Local training on this node's partition (as a robustness experiment's attacker
    where the ``attack.*`` keys name this partition: :mod:`fedsys.attacks`); the run
    config admitted by ``admission`` (default: under the operator's policy)."""
    call = train_call(msg, context, admission=admission)
    res = run_trainer(call.trainer, call.job)
    return train_reply(call, res, node_model.weights_record(call.job.net), context)


def evaluate_handler(msg: Message, context: Context, admission: Admission | None = None
                     ) -> Message:
    """Evaluate the received model on this node's local data."""
    cfg, ds, pid, _, x, y = _node(context, admission)
    loss, acc = evaluate(node_model.load_model(cfg, ds, msg), ds, x, y, cfg.eval_batch_size, pick_device(cfg.device))
    return proto.evaluate_reply(msg, len(y), loss, acc, {proto.PARTITION_ID: pid})


def query(msg: Message, context: Context, admission: Admission | None = None) -> Message:
    """Say which partition this node holds (an ``inflated-count`` attacker claims its
    inflated size here too, so that its train replies' claims agree with it)."""
    nc = context.node_config
    cfg, _, pid, nparts, _, y = _node(context, admission)
    attack = attack_of(cfg, pid, nparts, int(cfg.get("attack.start-round")))
    size = claimed_size(attack, len(y))
    return proto.query_reply(msg, pid, int(nc.get(proto.NUM_PARTITIONS, 0)), size)


class FedsysClientApp(ClientApp):
    """The fedsys ClientApp: :func:`train`, :func:`evaluate_handler` and :func:`query`,
    each admitting the run config by :attr:`admission`."""

    def __init__(self, admission: Admission) -> None:
        super().__init__()
        self.admission = admission
        self.train()(functools.partial(train, admission=admission))
        self.evaluate()(functools.partial(evaluate_handler, admission=admission))
        self.query()(functools.partial(query, admission=admission))


def make_app(policy: confine.Policy | None = None) -> FedsysClientApp:
    """A fedsys ClientApp admitting the run config under ``policy`` (default: the site
    operator's, from the environment).  :func:`fedsys_launch.engines.simulation.simulate` builds one
    in process under the policy of the run's own config, an object no run config can name
    (Flower's simulation engine hands it to its Ray actors pickled)."""
    return FedsysClientApp(Admission(policy))


#: The ClientApp Flower loads (``fedsys_launch.apps.client_app:app``): the operator's policy.
app = make_app()
