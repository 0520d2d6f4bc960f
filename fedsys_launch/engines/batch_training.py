"""The fedsys ClientApp's train handler for many nodes at once (:class:`BatchTraining`),
for the in-process engine: each node's instruction read as the ClientApp reads it, the
round's jobs trained together where they agree, each node's reply made as the ClientApp
makes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import Context, Message

from clients import TrainResult
from fedsys import protocol as proto
from fedsys.data import Normaliser
from fedsys_launch.apps import node_model
from fedsys_launch.apps.admission import Admission
from fedsys_launch.apps.client_app import TrainCall, train_call, train_reply

if TYPE_CHECKING:
    from fedsys_launch.engines.ray_training_workers import RayWorkers


def _received(call: TrainCall, net: torch.nn.Module,
              decoded: dict[int, tuple[Any, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """The weights ``call``'s instruction carries, as
    :func:`~fedsys_launch.apps.node_model.load_model` would load them into ``net`` (every
    key, each shape, the model's dtypes; where they do not match, the error it raises).
    ``decoded`` keeps each array's tensor by its bytes object, so that the instructions of a
    round that share the server's record decode it once (the tensors are read, never
    written)."""
    decoded = {} if decoded is None else decoded
    got = {}
    for k, arr in proto.model_record(call.msg.content).items():
        hit = decoded.get(id(arr.data))
        if hit is None or hit[0] is not arr.data:
            hit = decoded[id(arr.data)] = (arr.data, torch.from_numpy(proto.from_array(arr)))
        got[k] = hit[1]
    ref = _layout(net)
    if got.keys() != ref.keys() or any(got[k].shape != ref[k][0] for k in ref):
        net = node_model.load_model(call.cfg, call.ds, call.msg)  # raises, naming what differs
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
        (:class:`~fedsys_launch.engines.ray_training_workers.RayWorkers`)."""
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
