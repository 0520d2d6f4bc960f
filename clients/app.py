"""The fedsys ClientApp (``[tool.flwr.app.components] clientapp``).

It reads its partition from ``node_config`` (``partition-id``, ``num-partitions``
and, in deployment, ``data-dir``), trains with the trainer named in the message,
and echoes ``partition-id``, ``num-examples`` and the last-epoch mean training
loss in its reply.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients import TRAINERS, LocalConfig
from fedsys.config import RunConfig, from_run_config
from fedsys.data import Dataset
from fedsys.task import dataset, derive_seed, evaluate, model, partitions, pick_device

app = ClientApp()


@functools.lru_cache(maxsize=4)
def _config(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return from_run_config(dict(items))


def _partition_id(context: Context) -> int:
    nc = context.node_config
    if "partition-id" not in nc:
        raise ValueError(
            "node_config lacks 'partition-id'; start the SuperNode with "
            "--node-config \"partition-id=I num-partitions=N\"")
    return int(nc["partition-id"])


def _setup(context: Context) -> tuple[RunConfig, Dataset, int, torch.Tensor, torch.Tensor]:
    nc = context.node_config
    overrides = {"data-dir": str(nc["data-dir"])} if "data-dir" in nc else {}
    cfg = _config(tuple(sorted({**context.run_config, **overrides}.items())))
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    pid = _partition_id(context)
    nparts = int(nc.get("num-partitions", cfg.num_clients))
    if not 0 <= pid < nparts:
        raise ValueError(f"partition-id {pid} outside 0..{nparts - 1}")
    ds = dataset(cfg)
    idx = torch.from_numpy(partitions(cfg, nparts)[pid])
    return cfg, ds, pid, ds.x_train[idx], ds.y_train[idx]


def _load(cfg: RunConfig, ds: Dataset, msg: Message) -> torch.nn.Module:
    net = model(cfg, ds)
    net.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return net


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training on this node's partition."""
    cfg, ds, pid, x, y = _setup(context)
    c = msg.content["config"]
    rnd = int(c.get("server-round", 0))  # type: ignore[arg-type]
    name = str(c.get("trainer", "sgd"))
    if name not in TRAINERS:
        raise ValueError(f"unknown trainer {name!r}; registered: {', '.join(TRAINERS)}")
    extra = {k.split(".", 1)[1]: float(v) for k, v in c.items() if k.startswith("trainer.")}  # type: ignore[arg-type]
    local = LocalConfig(
        epochs=int(c.get("local-epochs", cfg.local_epochs)),  # type: ignore[arg-type]
        max_steps=int(c.get("local-steps", cfg.local_steps)),  # type: ignore[arg-type]
        batch_size=int(c.get("batch-size", cfg.batch_size)),  # type: ignore[arg-type]
        lr=float(c.get("lr", cfg.lr)),  # type: ignore[arg-type]
        momentum=float(c.get("momentum", cfg.momentum)),  # type: ignore[arg-type]
        weight_decay=float(c.get("weight-decay", cfg.weight_decay)),  # type: ignore[arg-type]
        seed=derive_seed(cfg.seed, rnd, pid),
        device=str(pick_device(cfg.device)),
        extra=extra,
    )
    net = _load(cfg, ds, msg)
    res = TRAINERS[name](net, x, y, ds.normalise, local)
    reply = RecordDict({
        "arrays": ArrayRecord(net.cpu().state_dict()),
        "metrics": MetricRecord({
            "partition-id": pid,
            "num-examples": res.num_examples,
            "train-loss": res.train_loss,
            "local-steps": res.steps,
        }),
    })
    return Message(reply, reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's local data."""
    cfg, ds, pid, x, y = _setup(context)
    loss, acc = evaluate(_load(cfg, ds, msg), ds, x, y, cfg.eval_batch_size, pick_device(cfg.device))
    metrics = MetricRecord({"partition-id": pid, "num-examples": len(y), "eval-loss": loss, "eval-acc": acc})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Say which partition this node holds."""
    nc = context.node_config
    rec = MetricRecord({
        "partition-id": _partition_id(context),
        "num-partitions": int(nc.get("num-partitions", 0)),
    })
    return Message(RecordDict({"metrics": rec}), reply_to=msg)
