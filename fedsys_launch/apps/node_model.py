"""The model a fedsys ClientApp trains or evaluates: built once per process
(:func:`built_model`), given an instruction's weights (:func:`load_model`), and read back
as the reply's record (:func:`weights_record`)."""

from __future__ import annotations

import functools

import torch
from flwr.app import ArrayRecord, Message

from fedsys import protocol as proto
from fedsys.config import RunConfig
from fedsys.data import Dataset
from fedsys.models import build_model


@functools.lru_cache(maxsize=4)
def built_model(name: str, in_shape: tuple[int, int, int], num_classes: int, seed: int,
                norm: str) -> torch.nn.Module:
    """The process's model of this configuration (:func:`fedsys.models.build_model`)."""
    return build_model(name, in_shape, num_classes, seed, norm)


def load_model(cfg: RunConfig, ds: Dataset, msg: Message) -> torch.nn.Module:
    """The configured model holding the instruction's weights.

    Built once per process (a simulation actor serves many messages; building cost more
    than a training step of a small model, ``benchmarks/client_overhead.py``) and stays
    where the last message left it (on the GPU when training ran there).  Every message
    overwrites all its parameters and buffers (a strict ``load_state_dict``), drops the
    gradients and sets training mode: what a freshly built model would be.
    """
    net = built_model(cfg.model, ds.input_shape, ds.num_classes, cfg.seed, cfg.model_norm)
    net.load_state_dict(proto.model_record(msg.content).to_torch_state_dict())
    net.zero_grad(set_to_none=True)
    return net.train()


def weights_record(net: torch.nn.Module) -> ArrayRecord:
    """``net``'s weights as a record (copied to the CPU; the model stays on its device)."""
    return proto.to_record({k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
