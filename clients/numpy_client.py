"""Any fedsys trainer inside a Flower compat-API app: a :class:`flwr.client.NumPyClient`.

Flower's compat API (``ClientApp(client_fn=...)``, ``ServerApp(server_fn=...)`` with
``flwr.server.strategy.FedAvg`` and friends) exchanges lists of NumPy arrays.
:class:`TrainerClient` runs a fedsys trainer (``sgd``, ``fedprox``, ``lss``, ``fedelmy``,
``fedseq`` or one of your own) in :meth:`~TrainerClient.fit` and scores the local
evaluation split in :meth:`~TrainerClient.evaluate`::

    def client_fn(context: Context) -> Client:
        net, (x, y), (xv, yv) = ...                    # your model and this node's data
        return TrainerClient(net, x, y, normalise, "lss", x_eval=xv, y_eval=yv,
                             options={"lss.ingredients": 4},
                             local=LocalConfig(epochs=1, batch_size=64, lr=5e-4)).to_client()

    app = ClientApp(client_fn=client_fn)

The round's ``config`` (the strategy's ``on_fit_config_fn``) overrides the local settings
by the keys of :mod:`fedsys.protocol` (``lr``, ``local-epochs``, ``batch-size``, ...,
``server-round``) and the trainer's options by their config keys (``lss.affinity``).
What needs the Message API instead: fedsys's server strategies (FedCDA, FedCross, IMA,
the FedELMY chain), per-node payloads and extra named models, trainer state kept in
``context.state``: :mod:`clients.message` runs the same trainers there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.client import NumPyClient

from clients.base import (
    LocalConfig,
    Normalise,
    Trainer,
    TrainJob,
    local_config,
    run_trainer,
    trainer_options,
)
from fedsys.seeding import derive_seed

if TYPE_CHECKING:
    import torch
    from torch import nn


class TrainerClient(NumPyClient):
    """A fedsys trainer as a Flower ``NumPyClient`` (see the module docstring).

    Parameters
    ----------
    net : torch.nn.Module
        The model; its ``state_dict`` order is the order of the exchanged arrays.
    x, y : torch.Tensor
        The node's raw training data (``normalise`` maps a batch to model input).
    normalise : callable
        Raw batch -> model input.
    trainer : str or Trainer class
        A name in :data:`clients.TRAINERS`, or a :class:`~clients.base.Trainer` subclass.
    x_eval, y_eval : torch.Tensor, optional
        The local evaluation split scored by :meth:`evaluate` (default: the training data).
    options : mapping, optional
        The trainer's options by config key (``{"lss.ingredients": 4}``).
    local : LocalConfig, optional
        Local-training settings the round's config may override.
    seed, partition_id : int
        The run seed and this node's partition: each round's draws derive from
        ``(seed, server-round, partition_id)``, as in the fedsys ClientApp.
    """

    def __init__(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, normalise: Normalise,
                 trainer: str | type[Trainer], *, x_eval: torch.Tensor | None = None,
                 y_eval: torch.Tensor | None = None, options: Mapping[str, Any] | None = None,
                 local: LocalConfig | None = None, seed: int = 0, partition_id: int = 0,
                 eval_batch_size: int = 256) -> None:
        from clients import trainer_class

        self.trainer = trainer_class(trainer)
        self.net, self.x, self.y, self.normalise = net, x, y, normalise
        self.x_eval = x if x_eval is None else x_eval
        self.y_eval = y if y_eval is None else y_eval
        self.options = dict(options or {})
        self.parse(self.options)  # a wrong key or value fails here, not in round 1
        self.local = local or LocalConfig()
        self.seed, self.partition_id = seed, partition_id
        self.eval_batch_size = eval_batch_size
        self.state: dict[str, Any] = {}

    def parse(self, given: Mapping[str, Any]) -> Any:
        """The trainer's typed options from config keys (``<prefix>.<option>``)."""
        return trainer_options(self.trainer, given)

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        """The model's ``state_dict`` as NumPy arrays, in order."""
        return [v.detach().cpu().numpy() for v in self.net.state_dict().values()]

    def set_parameters(self, parameters: list[np.ndarray]) -> None:
        """Load arrays in ``state_dict`` order (a count or shape mismatch is an error)."""
        import torch

        keys = list(self.net.state_dict())
        if len(keys) != len(parameters):
            raise ValueError(f"received {len(parameters)} arrays, the model has {len(keys)}")
        self.net.load_state_dict({k: torch.from_numpy(np.array(v, copy=True))
                                  for k, v in zip(keys, parameters, strict=True)})

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]
            ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Train with the fedsys trainer from the received model; return the trained
        arrays, the examples the trainer reports and its metrics (``train-loss``, ...)."""
        from fedsys import protocol as proto

        self.set_parameters(parameters)
        rnd = int(config.get(proto.SERVER_ROUND, 0))
        job = TrainJob(self.net, self.x, self.y, self.normalise,
                       local_config(config, self.local, derive_seed(self.seed, rnd, self.partition_id)),
                       self.parse({**self.options, **config}), self.state, {}, rnd,
                       self.partition_id, self.seed)
        res = run_trainer(self.trainer(), job)
        self.state = res.state
        return self.get_parameters({}), int(res.num_examples), {
            proto.TRAIN_LOSS: float(res.train_loss), proto.LOCAL_STEPS: int(res.steps),
            **{k: float(v) for k, v in res.metrics.items()}}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]
                 ) -> tuple[float, int, dict[str, Any]]:
        """Mean cross-entropy and accuracy of the received model on the local split."""
        import torch

        from fedsys.task import score

        self.set_parameters(parameters)
        loss, acc = score(self.net, self.normalise, self.x_eval, self.y_eval,
                          self.eval_batch_size, torch.device(self.local.device))
        return float(loss), len(self.y_eval), {"accuracy": float(acc)}


__all__ = ["TrainerClient"]
