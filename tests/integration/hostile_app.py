"""A ClientApp with one hostile node, for ``test_fuzz.py``.

Every node runs fedsys's own client (``fedsys_launch.apps.client_app``); the node holding partition
:data:`HOSTILE` then replaces its honest train reply with one malformed kind after
another (:data:`KINDS`, cycling, counted in the node's own ``context.state``), so every
strategy meets every kind whatever its sampling.  ``dead_app`` is the reference: the same
node fails every train message instead (a node that contributes nothing)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsys_launch.apps import client_app as fedsys_client

HOSTILE = 0


def _arrays(reply: Message, change: Callable[[dict[str, np.ndarray]], None]) -> RecordDict:
    arrs = {k: v.numpy().copy() for k, v in reply.content["arrays"].items()}
    change(arrs)
    out = RecordDict(dict(reply.content.items()))
    out["arrays"] = ArrayRecord({k: _arr(v) for k, v in arrs.items()})
    return out


def _arr(v: np.ndarray) -> Array:
    return Array(np.ascontiguousarray(v))


def _first_float(arrs: dict[str, np.ndarray]) -> str:
    return next(k for k, v in arrs.items() if v.dtype.kind == "f")


def _set(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(arrs: dict[str, np.ndarray]) -> None:
        arrs[_first_float(arrs)].flat[0] = value
    return change


def _metrics(reply: Message, **changes: object) -> RecordDict:
    m = dict(reply.content["metrics"].items())
    for k, v in changes.items():
        key = k.replace("_", "-")
        if v is None:
            m.pop(key, None)
        else:
            m[key] = v  # type: ignore[assignment]
    out = RecordDict(dict(reply.content.items()))
    out["metrics"] = MetricRecord(m)  # type: ignore[arg-type]
    return out


def _with(reply: Message, key: str, record: object) -> RecordDict:
    out = RecordDict(dict(reply.content.items()))
    out[key] = record  # type: ignore[assignment]
    return out


def _without(reply: Message, key: str) -> RecordDict:
    return RecordDict({k: v for k, v in reply.content.items() if k != key})


def _string_metric(reply: Message) -> RecordDict:
    out = _without(reply, "metrics")
    cfg = {k: v for k, v in reply.content["metrics"].items()}
    cfg["train-loss"] = "low"  # type: ignore[assignment]
    out["metrics"] = ConfigRecord(cfg)  # type: ignore[arg-type]
    return out


def _reshape(arrs: dict[str, np.ndarray]) -> None:
    k = _first_float(arrs)
    arrs[k] = arrs[k].ravel()[:-1]


def _float64(arrs: dict[str, np.ndarray]) -> None:
    k = _first_float(arrs)
    arrs[k] = arrs[k].astype(np.float64)


KINDS: dict[str, Callable[[Message], RecordDict]] = {
    "nan": lambda r: _arrays(r, _set(float("nan"))),
    "+inf": lambda r: _arrays(r, _set(float("inf"))),
    "-inf": lambda r: _arrays(r, _set(float("-inf"))),
    "wrong-shape": lambda r: _arrays(r, _reshape),
    "wrong-dtype": lambda r: _arrays(r, _float64),
    "no-arrays": lambda r: _without(r, "arrays"),
    "extra-arrays": lambda r: _with(r, "arrays-2", r.content["arrays"]),
    "no-metrics": lambda r: _without(r, "metrics"),
    "extra-metrics": lambda r: _with(r, "metrics-2", MetricRecord({"x": 1.0})),
    "string-metric": _string_metric,
    "list-metric": lambda r: _metrics(r, train_loss=[0.1, 0.2]),
    "no-num-examples": lambda r: _metrics(r, num_examples=None),
    "negative-num-examples": lambda r: _metrics(r, num_examples=-5),
    "zero-num-examples": lambda r: _metrics(r, num_examples=0),
    "fractional-num-examples": lambda r: _metrics(r, num_examples=12.5),
    "huge-num-examples": lambda r: _metrics(r, num_examples=10**12),
    "wrong-partition-id": lambda r: _metrics(r, partition_id=HOSTILE + 1),
    "empty": lambda r: RecordDict(),
}

app = ClientApp()
dead_app = ClientApp()


@app.query()
@dead_app.query()
def query(msg: Message, context: Context) -> Message:
    """fedsys's own query handler."""
    return fedsys_client.query(msg, context)


@app.evaluate()
@dead_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """fedsys's own evaluation."""
    return fedsys_client.evaluate_handler(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """fedsys's training; on the hostile node, the next malformed kind instead."""
    honest = fedsys_client.train(msg, context)
    if int(context.node_config["partition-id"]) != HOSTILE:
        return honest
    seen = context.state.get("hostile", ConfigRecord({"n": 0}))
    n = int(seen["n"])  # type: ignore[arg-type]
    context.state["hostile"] = ConfigRecord({"n": n + 1})
    kind = list(KINDS)[n % len(KINDS)]
    return Message(content=KINDS[kind](honest), reply_to=msg)


@dead_app.train()
def dead_train(msg: Message, context: Context) -> Message:
    """fedsys's training; the hostile node's place fails every time."""
    if int(context.node_config["partition-id"]) == HOSTILE:
        raise RuntimeError("this node contributes nothing")
    return fedsys_client.train(msg, context)
