"""The fedsys ClientApp (``[tool.flwr.app.components] clientapp``).

It reads its partition from ``node_config`` (``partition-id``, ``num-partitions``
and, in deployment, ``data-dir``), trains with the trainer the instruction names
(typed settings and the trainer's options from the instruction, the run config
filling in), keeps the trainer's state in ``context.state`` across rounds, and
replies as :mod:`fedsys.protocol` says.

Before it reads data or imports a plugin it admits the run config (:class:`Admission`)
under a policy (:mod:`fedsys.confine`): :data:`app`, the one Flower loads, under the site
operator's (``FEDSYS_ROOTS``, ``FEDSYS_PLUGINS``, the node config's ``data-dir`` allowed);
the app :func:`fedsys_launch.engines.simulation.simulate` builds (:func:`make_app`) under the policy
of the run's own config (:func:`fedsys.confine.own_run_policy`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from clients import LocalConfig, Trainer, TrainJob, TrainResult, trainer_class
from clients.base import local_config, run_trainer, trainer_options
from fedsys import attacks, confine, trainer_state
from fedsys import protocol as proto
from fedsys.config import ConfigError, RunConfig
from fedsys.data import Dataset, Normaliser
from fedsys.dp import clip_update
from fedsys.models import build_model
from fedsys.options import parse_group
from fedsys.seeding import derive_seed
from fedsys.task import client_data, dataset, evaluate, pick_device
from fedsys_launch.config_schema import from_run_config

if TYPE_CHECKING:
    from fedsys_launch.engines.ray_training_workers import RayWorkers

@functools.lru_cache(maxsize=4)
def _config(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return from_run_config(dict(items))


def _admit(run_config: Mapping[str, Any], policy: confine.Policy, node_data_dir: str | None,
           build: Callable[[Mapping[str, Any]], RunConfig]) -> RunConfig:
    if node_data_dir is not None:
        policy = policy.reading(node_data_dir)
    return confine.admit(run_config, policy, build, confine.CLIENT_KEYS)


@functools.lru_cache(maxsize=4)
def _admitted_under(policy: confine.Policy, items: tuple[tuple[str, Any], ...],
                    node_data_dir: str | None) -> RunConfig:
    """``items`` admitted under a fixed ``policy``: checked once per process (Flower's
    simulation engine hands its actors the app anew with every message)."""
    return _admit(dict(items), policy, node_data_dir, lambda _: _config(items))


class Admission:
    """How a fedsys ClientApp admits each message's run config (:func:`fedsys.confine.admit`):
    under ``policy``, or, where it is None, the site operator's policy read from the
    environment at every message (:func:`fedsys.confine.policy_from_env`).

    The last config admitted is kept (every node of a round brings the same run config):
    built once, and under a fixed ``policy`` checked once.
    """

    def __init__(self, policy: confine.Policy | None = None) -> None:
        self.policy = policy
        #: the last run config admitted: the dict, the node's data-dir and its RunConfig
        self._last: tuple[dict[str, Any], str | None, RunConfig] | None = None

    def __call__(self, run_config: dict[str, Any], node_data_dir: str | None) -> RunConfig:
        """The config of ``run_config`` (the node's ``data-dir`` already in it), admitted.

        Raises
        ------
        ConfigError
            A key the policy refuses, named (the node's ``data-dir`` is allowed).
        """
        last = self._last  # one read: another thread may set it meanwhile
        if self.policy is not None:
            if last is not None and last[1] == node_data_dir and last[0] == run_config:
                return last[2]  # a dict compare, no sorting, for every node
            cfg = _admitted_under(self.policy, tuple(sorted(run_config.items())), node_data_dir)
        else:
            def build(rc: Mapping[str, Any]) -> RunConfig:
                if last is not None and last[0] == rc:
                    return last[2]
                return _config(tuple(sorted(rc.items())))

            cfg = _admit(run_config, confine.policy_from_env(os.environ), node_data_dir, build)
        self._last = (dict(run_config), node_data_dir, cfg)
        return cfg


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


@functools.lru_cache(maxsize=4)
def _built(name: str, in_shape: tuple[int, int, int], num_classes: int, seed: int,
           norm: str) -> torch.nn.Module:
    return build_model(name, in_shape, num_classes, seed, norm)


def _load(cfg: RunConfig, ds: Dataset, msg: Message) -> torch.nn.Module:
    """The configured model holding the instruction's weights.

    Built once per process (a simulation actor serves many messages; building cost more
    than a training step of a small model, ``benchmarks/client_overhead.py``) and stays
    where the last message left it (on the GPU when training ran there).  Every message
    overwrites all its parameters and buffers (a strict ``load_state_dict``), drops the
    gradients and sets training mode: what a freshly built model would be.
    """
    net = _built(cfg.model, ds.input_shape, ds.num_classes, cfg.seed, cfg.model_norm)
    net.load_state_dict(proto.model_record(msg.content).to_torch_state_dict())
    net.zero_grad(set_to_none=True)
    return net.train()


def _received(call: TrainCall, net: torch.nn.Module,
              decoded: dict[int, tuple[Any, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """The weights ``call``'s instruction carries, as :func:`_load` would load them into
    ``net`` (every key, each shape, the model's dtypes; where they do not match, the error
    :func:`_load` raises).  ``decoded`` keeps each array's tensor by its bytes object, so
    that the instructions of a round that share the server's record decode it once (the
    tensors are read, never written)."""
    decoded = {} if decoded is None else decoded
    got = {}
    for k, arr in proto.model_record(call.msg.content).items():
        hit = decoded.get(id(arr.data))
        if hit is None or hit[0] is not arr.data:
            hit = decoded[id(arr.data)] = (arr.data, torch.from_numpy(proto.from_array(arr)))
        got[k] = hit[1]
    ref = _layout(net)
    if got.keys() != ref.keys() or any(got[k].shape != ref[k][0] for k in ref):
        net = _load(call.cfg, call.ds, call.msg)  # raises, naming what differs
        return {k: v.detach().clone() for k, v in net.state_dict().items()}
    return {k: got[k].to(dtype) for k, (_, dtype) in ref.items()}


#: each model's state-dict layout (:func:`_layout`), by the model (the process's few)
_LAYOUTS: dict[int, tuple[torch.nn.Module, dict[str, tuple[torch.Size, torch.dtype]]]] = {}


def _layout(net: torch.nn.Module) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """``net``'s state-dict keys, in order, with each tensor's shape and dtype: read once
    per model (a round asks it for every client of the process's one model)."""
    kept = _LAYOUTS.get(id(net))
    if kept is None or kept[0] is not net:
        kept = _LAYOUTS[id(net)] = (net, {k: (v.shape, v.dtype) for k, v in net.state_dict().items()})
        if len(_LAYOUTS) > 8:
            _LAYOUTS.clear()
            _LAYOUTS[id(net)] = kept
    return kept[1]


def _weights(net: torch.nn.Module) -> ArrayRecord:
    """``net``'s weights as a record (copied to the CPU; the model stays on its device)."""
    return proto.to_record({k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})


def run_local_config(cfg: RunConfig, s: dict[str, Any], seed: int) -> LocalConfig:
    """The round's local-training settings: the instruction's, else the run config's."""
    return local_config(s, LocalConfig(
        epochs=cfg.local_epochs, max_steps=cfg.local_steps, batch_size=cfg.batch_size,
        lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, optimizer=cfg.optimizer,
        trainable=cfg.trainable,
        device=str(pick_device(cfg.device))), seed)


@functools.lru_cache(maxsize=4)
def _attack_options(cfg: RunConfig) -> attacks.AttackOptions:
    """The run's ``attack.*`` options, parsed once per config (every node reads them for
    every instruction)."""
    options: attacks.AttackOptions = parse_group(attacks.AttackOptions, "attack", cfg.group("attack"))
    return options


def _attack(cfg: RunConfig, pid: int, nparts: int, rnd: int) -> attacks.AttackOptions | None:
    """The attack this node makes this round (``attack.*`` keys), or None: it is honest."""
    try:
        options = _attack_options(cfg)
        hostile = attacks.active(options, cfg.seed, pid, nparts, rnd)
    except (ConfigError, ValueError) as exc:
        raise ValueError(f"attack options: {exc}") from None
    return options if hostile else None


@dataclass
class TrainCall:
    """One train instruction as the ClientApp has read it, up to the training itself:
    :func:`train` is :func:`train_call`, :func:`clients.base.run_trainer` on ``job``, then
    :func:`train_reply`; the in-process engine trains the jobs of many calls together in
    between (:class:`BatchTraining`)."""

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
    attack = _attack(cfg, pid, nparts, rnd)
    if attack is not None and attack.kind == "label-flip":
        y = torch.as_tensor(attacks.flip_labels(y.cpu().numpy(), ds.num_classes))
    name = str(s.get(proto.TRAINER, "sgd"))
    trainer = trainer_class(name)
    try:
        options = trainer_options(trainer, {**cfg.group(trainer.prefix()), **s})
    except ConfigError as exc:
        raise ValueError(f"trainer {name!r}: {exc}") from None
    scope = f"{s.get(proto.STATE_SCOPE, '')}/{name}"
    net = (_load(cfg, ds, msg) if load else
           _built(cfg.model, ds.input_shape, ds.num_classes, cfg.seed, cfg.model_norm))
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
        weights, num_examples = _attacked(call.attack, call.cfg, call.ds, msg, weights, num_examples,
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
    return train_reply(call, res, _weights(call.job.net), context)


class BatchTraining:
    """The train handler of the fedsys ClientApp (:func:`train`) for many nodes at once,
    in three parts, for the in-process engine (:class:`fedsys_launch.engines.inprocess.InProcessGrid`):
    :meth:`prepare` reads each node's instruction (:func:`train_call`), :meth:`train`
    trains the round's jobs, those that agree together (:func:`clients.batched.train_together`,
    the rest one at a time), :meth:`reply` makes each node's reply (:func:`train_reply`).

    Only for the fedsys ClientApp's own handler (the engine checks that it calls a
    :class:`FedsysClientApp`), whose :class:`Admission` it is given.
    """

    def __init__(self, policy: str = "auto", devices: list[str] | None = None,
                 workers: RayWorkers | None = None, admission: Admission | None = None) -> None:
        #: ``batch-clients``: ``auto`` leaves to one at a time what is faster so
        #: (:func:`clients.batched.slower_batched`), ``true`` batches whatever it can
        self.policy = policy
        #: the devices a group is spread over (default: every visible GPU for ``cuda``,
        #: :func:`clients.batched.devices_for`)
        self.devices = devices
        #: Ray workers that train the groups instead (config key ``ray-address``)
        self.workers = workers
        #: the round's decoded arrays (:func:`_received`), dropped when it has trained
        self.decoded: dict[int, tuple[Any, torch.Tensor]] = {}
        #: how the app it stands for admits the run config (default: the operator's policy)
        self.admission = admission or Admission()

    def prepare(self, msg: Message, context: Context) -> tuple[TrainCall, dict[str, torch.Tensor]] | None:
        """``msg`` read on this node and its received weights, or None where its job does
        not train batched (its trainer offers no :class:`~clients.base.BatchSpec`, its
        model couples a batch's samples): the engine then calls the ClientApp."""
        from clients.base import TRAINABLE
        from clients.batched import slower_batched, unbatchable

        call = train_call(msg, context, load=False, admission=self.admission)
        job = call.job
        if (call.trainer.batch_spec(job) is None or job.config.trainable not in TRAINABLE
                or unbatchable(job.net)
                or (self.policy == "auto" and slower_batched(
                    job.net, self.workers.device if self.workers else job.config.device))):
            return None
        return call, _received(call, job.net, self.decoded)

    @staticmethod
    def key(prepared: tuple[TrainCall, dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """What the jobs trained together share: model, dataset, local configuration."""
        from clients.batched import group_key

        call = prepared[0]
        return (call.cfg.model, call.cfg.model_norm, call.cfg.dataset, group_key(call.job.config))

    def train(self, group: list[tuple[TrainCall, dict[str, torch.Tensor]]]
              ) -> Sequence[tuple[TrainResult | Exception, dict[str, torch.Tensor]]]:
        """Train a group of prepared calls of one :meth:`key` together, spread over the
        devices (:func:`clients.batched.train_on_devices`) or the Ray workers
        (:class:`fedsys_launch.engines.ray_training_workers.RayWorkers`)."""
        from clients.batched import devices_for, train_on_devices

        self.decoded.clear()
        calls = [c for c, _ in group]
        specs = [c.trainer.batch_spec(c.job) for c in calls]
        assert all(s is not None for s in specs)
        if self.workers is not None:
            ds = calls[0].ds
            return self.workers.train(calls[0].job.net, [w for _, w in group],
                                      [c.job for c in calls], specs,  # type: ignore[arg-type]
                                      Normaliser(ds.mean, ds.std))
        devices = self.devices or devices_for(calls[0].job.config.device)
        return train_on_devices(calls[0].job.net, [w for _, w in group],
                                [c.job for c in calls], specs, devices)  # type: ignore[arg-type]

    @staticmethod
    def reply(prepared: tuple[TrainCall, dict[str, torch.Tensor]],
              trained: tuple[TrainResult | Exception, dict[str, torch.Tensor]],
              context: Context) -> Message:
        """The node's reply, as :func:`train` makes it (the training's error raised)."""
        res, weights = trained
        if isinstance(res, Exception):
            raise res
        return train_reply(prepared[0], res,
                           proto.to_record({k: v.detach().cpu().numpy() for k, v in weights.items()}),
                           context)


def _attacked(attack: attacks.AttackOptions, cfg: RunConfig, ds: Dataset, msg: Message,
              weights: ArrayRecord, num_examples: int, seed: int) -> tuple[ArrayRecord, int]:
    """The attacker's reply in place of the honest ``weights`` and ``num_examples``."""
    kind = attack.kind
    if kind not in attacks.UPDATE_KINDS and kind != "inflated-count":
        return weights, num_examples  # label-flip: the training was the attack
    sent = proto.from_record(proto.model_record(msg.content))
    if kind == "inflated-count":
        fresh = build_model(cfg.model, ds.input_shape, ds.num_classes, seed, cfg.model_norm)
        return _weights(fresh), attacks.claimed_examples(num_examples, attack.count_factor)
    model = proto.from_record(weights)
    if kind == "noise":
        out = attacks.noise_update(sent, attack.noise_std, seed)
    else:
        out = attacks.scaled_update(model, sent, attack.scale if kind == "scaled" else -1.0)
    return proto.to_record(out), num_examples


def evaluate_handler(msg: Message, context: Context, admission: Admission | None = None
                     ) -> Message:
    """Evaluate the received model on this node's local data."""
    cfg, ds, pid, _, x, y = _node(context, admission)
    loss, acc = evaluate(_load(cfg, ds, msg), ds, x, y, cfg.eval_batch_size, pick_device(cfg.device))
    return proto.evaluate_reply(msg, len(y), loss, acc, {proto.PARTITION_ID: pid})


def query(msg: Message, context: Context, admission: Admission | None = None) -> Message:
    """Say which partition this node holds (an ``inflated-count`` attacker claims its
    inflated size here too, so that its train replies' claims agree with it)."""
    nc = context.node_config
    cfg, _, pid, nparts, _, y = _node(context, admission)
    attack = _attack(cfg, pid, nparts, int(cfg.get("attack.start-round")))
    size = len(y)
    if attack is not None and attack.kind == "inflated-count":
        size = attacks.claimed_examples(size, attack.count_factor)
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
