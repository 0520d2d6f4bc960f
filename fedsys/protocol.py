"""The fedsys message protocol: every key of every Flower message, on both sides.

One module defines what the server sends and what a ClientApp answers, so the
strategies (:mod:`strategies`) and the ClientApp build and read messages with the
same names.  No message key is written as a string literal anywhere else (a unit
test checks).  The protocol follows Flower's own conventions, so a ClientApp written
from Flower's quickstart speaks it:

* a **train instruction** holds the model in the ArrayRecord ``"arrays"`` and its
  settings in the ConfigRecord ``"config"`` (``server-round``, ``lr``, ``local-epochs``,
  ..., and method keys such as ``fedprox.mu``), typed: ints stay ints, floats floats,
  strings and bools as they are; further models (anchors, a pool) travel as extra
  ArrayRecords ``"model.<name>"``;
* a **train reply** holds the trained model in ``"arrays"`` and one MetricRecord
  ``"metrics"`` with ``num-examples`` (required, as Flower's FedAvg requires it; a
  strategy's ``weighted_by_key`` names it) and, optionally, ``train-loss``,
  ``local-steps``, ``partition-id`` and any other numbers (Flower's app template:
  ``train_loss``, which a strategy's ``train_loss_key`` names); extra models (a pool,
  ingredients) as ``"model.<name>"`` ArrayRecords.  As Flower's strategies read it, the
  model's and the metrics' record names are free (the one ArrayRecord that is not a
  named extra model, the one MetricRecord: :func:`model_key`), and ConfigRecords are the
  client's own (Flower's tutorial "Communicate custom Messages" sends objects that way),
  left to a strategy that overrides ``aggregate_train`` to read them; the model may leave
  out arrays its client keeps (Flower's FedBN how-to: the batch-norm layers), which then
  hold what the node was sent (the reply pipeline's ``check_values``, ``strategies/replies.py``);
* an instruction's record names are a strategy's ``arrayrecord_key`` and
  ``configrecord_key`` (Flower's keywords; default ``"arrays"``, ``"config"``);
* an **evaluate instruction / reply**: ``"arrays"`` + ``"config"``, and ``"metrics"``
  with ``num-examples``, ``eval-loss``, ``eval-acc``;
* a **query**, sent only where the server asks for it (``query_partitions``), asks a
  node which partition it holds (``partition-id``, ``num-partitions``); otherwise a
  node's partition is the ``partition-id`` its first train reply reports, and a node
  that reports none is keyed by its node id.

Each message gets its own :class:`~flwr.app.RecordDict`, so per-node payloads need
nothing special.  Beside this module: :mod:`fedsys.transport` (messages to the SuperLink
and back), :mod:`fedsys.validation` (what a judged reply is: a
:class:`~fedsys.validation.ClientUpdate` or a :class:`~fedsys.validation.Rejection`) and
:mod:`fedsys.trainer_state` (a trainer's state between rounds).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SType

from fedsys.options import Scalar
from fedsys.params import Params

# ---------------------------------------------------------------- record names
ARRAYS = "arrays"  #: the model (Flower's ``arrayrecord_key`` default)
CONFIG = "config"  #: the settings (Flower's ``configrecord_key`` default)
METRICS = "metrics"  #: the reply's numbers
MODEL_PREFIX = "model."  #: extra named models: ``model.<name>``
STATE_PREFIX = "fedsys.state"  #: a trainer's state in ``context.state``: ``fedsys.state[<scope>]``

# ---------------------------------------------------------------- config keys
SERVER_ROUND = "server-round"
TRAINER = "trainer"
STATE_SCOPE = "fedsys.scope"  #: which strategy of the run a trainer's state belongs to
LR = "lr"
LOCAL_EPOCHS = "local-epochs"
LOCAL_STEPS = "local-steps"
BATCH_SIZE = "batch-size"
MOMENTUM = "momentum"
OPTIMIZER = "optimizer"
TRAINABLE = "trainable"  #: all, or head (the classifier layer only)
WEIGHT_DECAY = "weight-decay"
WARMUP_EPOCHS = "warmup-epochs"  #: plain epochs before the method's training (a chain's first hop)
INIT_SEED = "init-seed"  #: re-initialise the model from this seed first (own-init variants)
DP_CLIPPING_NORM = "dp-clipping-norm"  #: client-side DP: clip the update to this L2 norm
#: FedProx's mu as Flower's ``FedProx`` sends it (its clients read ``config["proximal-mu"]``)
PROXIMAL_MU = "proximal-mu"
ASK = "ask"

# ---------------------------------------------------------------- metric keys
NUM_EXAMPLES = "num-examples"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
TRAIN_LOSS = "train-loss"
#: the training loss as Flower's app template reports it and Flower's ``QFedAvg`` reads
#: it (``train_loss_key``): a strategy's default, fedsys's own ClientApp says ``train-loss``
FLOWER_TRAIN_LOSS = "train_loss"
#: examples the local training went through (every epoch, every model a trainer trains):
#: the client-training work the results compare methods on
TRAINED_EXAMPLES = "trained-examples"
EVAL_LOSS = "eval-loss"
EVAL_ACC = "eval-acc"

SUPERLINK_NODE_ID = 1


# ---------------------------------------------------------------- reading a message's records

def array_records(content: RecordDict) -> dict[str, ArrayRecord]:
    """``content.array_records`` to read: the ArrayRecords by name, in order.  Flower's
    property builds a dictionary that writes every record back into ``content`` (checked
    twice) at each reading: a message read a few times a round paid most of its reading
    time there."""
    return {k: r for k, r in content.items() if isinstance(r, ArrayRecord)}


def metric_records(content: RecordDict) -> dict[str, MetricRecord]:
    """``content.metric_records`` to read (see :func:`array_records`)."""
    return {k: r for k, r in content.items() if isinstance(r, MetricRecord)}


def config_records(content: RecordDict) -> dict[str, ConfigRecord]:
    """``content.config_records`` to read (see :func:`array_records`)."""
    return {k: r for k, r in content.items() if isinstance(r, ConfigRecord)}


# ---------------------------------------------------------------- arrays

#: Numeric kinds whose ``.npy`` form is a header and the raw bytes (no object, no
#: structured dtype): the ones :func:`to_array` / :func:`from_array` take the short way for.
_PLAIN_KINDS = frozenset("biufc")
#: The ``.npy`` header ``numpy.save`` writes for a C-ordered array of each
#: ``(dtype.str, shape)`` this process has written, and ``str(dtype)`` (the Array's
#: ``dtype``): learnt from ``numpy.save`` itself.
_WRITTEN: dict[tuple[str, tuple[int, ...]], tuple[bytes, str]] = {}
#: Each ``.npy`` header ``numpy.load`` has read in this process (version 1.0, C order, a
#: plain dtype), with its dtype, shape and the data's size: learnt from ``numpy.load`` itself.
_READ: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}
_HEADERS_KEPT = 1024  #: a cache that grows past this is emptied (shapes a run sends are few)


def to_array(x: np.ndarray) -> Array:
    """``x`` as a Flower :class:`~flwr.app.Array` (C order), equal field for field and byte
    for byte to ``Array(x)``: the data is the ``numpy.save`` file.  Its header is written
    by ``numpy.save`` once per dtype and shape and kept, so a model's arrays cost one copy
    each (``Array(x)`` formats the header again for every array: most of the time of a
    small model's message)."""
    x = np.require(x, requirements="C")
    if x.dtype.kind not in _PLAIN_KINDS or x.dtype.fields is not None:
        return Array(x)
    key = (x.dtype.str, x.shape)
    kept = _WRITTEN.get(key)
    if kept is None:
        data = Array(x).data
        kept = (data[: len(data) - x.nbytes], str(x.dtype))
        if len(_WRITTEN) >= _HEADERS_KEPT:
            _WRITTEN.clear()
        _WRITTEN[key] = kept
    return _array(kept[1], x.shape, b"".join((kept[0], x.data)))  # one copy of the values


def _array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    """``Array(dtype=dtype, shape=shape, stype=SType.NUMPY, data=data)`` without its
    constructor's reading of its arguments (which of its forms, each type checked: a few
    microseconds an array, thousands of arrays a round): the same object, its attributes
    those the constructor sets, in its order (``tests/unit/test_array_codec.py`` holds
    them equal under each Flower release fedsys supports)."""
    out: Array = Array.__new__(Array)
    out.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype=SType.NUMPY, data=data)
    return out


def from_array(array: Array) -> np.ndarray:
    """``array.numpy()``, the same array (dtype, shape, values, a writable copy) and the same
    error for every input.  A header ``numpy.load`` has read before (plain dtype, C order,
    no byte after the data) is not parsed again: the values are copied out of the data
    directly; any other input goes to ``numpy.load`` (through ``array.numpy()``)."""
    data = array.data
    if (isinstance(data, bytes) and array.stype == SType.NUMPY
            and data[:8] == b"\x93NUMPY\x01\x00" and len(data) >= 10):
        end = 10 + int.from_bytes(data[8:10], "little")
        hit = _READ.get(data[:end])
        if hit is not None and len(data) == end + hit[2]:
            dtype, shape, _ = hit
            return np.frombuffer(data, dtype, offset=end).reshape(shape).copy()
    out = array.numpy()
    if isinstance(data, bytes):  # a record's arrays hold bytes; anything else is read alone
        _learn(data, out)
    return out


def _learn(data: bytes, out: np.ndarray) -> None:
    """Keep the header of ``data``, which ``numpy.load`` read as ``out``, where
    :func:`from_array` can read the like of it directly."""
    import io

    fp = io.BytesIO(data)
    if np.lib.format.read_magic(fp) != (1, 0):
        return
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    end = fp.tell()
    if (fortran or dtype.kind not in _PLAIN_KINDS or dtype.fields is not None
            or dtype.subdtype is not None or len(data) != end + out.nbytes
            or out.dtype != dtype or out.shape != shape):
        return
    if len(_READ) >= _HEADERS_KEPT:
        _READ.clear()
    _READ[data[:end]] = (dtype, shape, out.nbytes)


def to_record(params: Params) -> ArrayRecord:
    """Wrap :data:`Params` as an :class:`ArrayRecord` (order kept; each array
    :func:`to_array`)."""
    record = ArrayRecord()
    for k, v in params.items():  # ArrayRecord(array_dict=...) would build every Array twice
        record[k] = to_array(v)
    return record


def from_record(record: ArrayRecord) -> Params:
    """Read an :class:`ArrayRecord` back into :data:`Params` (each array :func:`from_array`)."""
    return {k: from_array(a) for k, a in record.items()}


def model_bytes(message: Message) -> tuple[int, int]:
    """``(models, bytes)`` a message carries: its ArrayRecords and their serialised
    size (every array's bytes as they travel)."""
    if not message.has_content():
        return 0, 0
    recs = list(array_records(message.content).values())
    return len(recs), sum(len(a.data) for r in recs for a in r.values())


def config_record(config: Mapping[str, object]) -> ConfigRecord:
    """A fresh :class:`ConfigRecord` holding scalar config values (types kept).  Given a
    ConfigRecord, its copy (Flower's ``copy``: the values' types were checked when it was
    made; a round's instructions share one config and each gets its own record)."""
    if type(config) is ConfigRecord:
        return config.copy()
    return ConfigRecord({k: v for k, v in config.items()})  # type: ignore[misc]


def extra_models(content: RecordDict) -> dict[str, Params]:
    """The named extra models (``model.<name>`` ArrayRecords) of a message."""
    return {k[len(MODEL_PREFIX):]: from_record(r) for k, r in array_records(content).items()
            if k.startswith(MODEL_PREFIX)}


def model_key(content: RecordDict, key: str = ARRAYS) -> str | None:
    """The name of a message's model ArrayRecord: ``key`` where the message holds it,
    else its one ArrayRecord that is not a named extra model (``model.<name>``), as
    Flower's strategies take a reply's one ArrayRecord whatever its name (and send it
    under their ``arrayrecord_key``); ``None`` when there is none, or several."""
    records = array_records(content)
    if key in records:
        return key
    main = [k for k in records if not k.startswith(MODEL_PREFIX)]
    return main[0] if len(main) == 1 else None


def model_record(content: RecordDict, key: str = ARRAYS) -> ArrayRecord:
    """A message's model ArrayRecord (:func:`model_key`); a KeyError naming what the
    message holds when it has none it can be told by."""
    name = model_key(content, key)
    if name is None:
        raise KeyError(f"the message holds no model ArrayRecord '{key}' (ArrayRecords: "
                       f"{sorted(array_records(content))})")
    return content[name]  # type: ignore[return-value]  # model_key names an ArrayRecord


def settings(content: RecordDict, key: str = CONFIG) -> dict[str, Scalar]:
    """A message's settings as a plain typed dict: its ConfigRecord ``key``, else its one
    ConfigRecord whatever its name (a strategy's ``configrecord_key``), else none."""
    records = config_records(content)
    name = key if key in records else next(iter(records)) if len(records) == 1 else None
    if name is None:
        return {}
    return {k: v for k, v in records[name].items()}  # type: ignore[misc]


def metrics_of(content: RecordDict) -> dict[str, float]:
    """All numeric scalars of all MetricRecords in ``content``."""
    out: dict[str, float] = {}
    for rec in metric_records(content).values():
        for k, v in rec.items():
            if isinstance(v, int | float):
                out[k] = float(v)
    return out


# ---------------------------------------------------------------- instructions

def message(
    node_id: int,
    message_type: str,
    arrays: Params | ArrayRecord | None = None,
    config: Mapping[str, object] | None = None,
    models: Mapping[str, Params] | None = None,
    arrays_key: str = ARRAYS,
    config_key: str = CONFIG,
) -> Message:
    """Build one instruction with its own RecordDict.

    ``models`` adds further named models (``model.<name>`` ArrayRecords): anchors, a
    pool, a per-node payload beside the main model.  ``arrays_key`` and ``config_key``
    name the model and the settings (a strategy's ``arrayrecord_key`` and
    ``configrecord_key``, Flower's keywords).
    """
    content = RecordDict()
    if arrays is not None:
        content[arrays_key] = arrays if isinstance(arrays, ArrayRecord) else to_record(arrays)
    for name, m in (models or {}).items():
        content[MODEL_PREFIX + name] = to_record(m)
    content[config_key] = config_record(config or {})
    return Message(content, dst_node_id=node_id, message_type=message_type)


def query_message(node_id: int) -> Message:
    """A QUERY asking a node which partition it holds."""
    return message(node_id, MessageType.QUERY, config={ASK: PARTITION_ID})


# ---------------------------------------------------------------- client replies

def train_reply(
    instruction: Message, model: Params | ArrayRecord, num_examples: int,
    metrics: Mapping[str, float | int], models: Mapping[str, Params] | None = None,
) -> Message:
    """The reply of a ClientApp to a train instruction."""
    content = RecordDict({
        ARRAYS: model if isinstance(model, ArrayRecord) else to_record(model),
        METRICS: MetricRecord({NUM_EXAMPLES: int(num_examples), **dict(metrics)}),
    })
    for name, m in (models or {}).items():
        content[MODEL_PREFIX + name] = to_record(m)
    return Message(content, reply_to=instruction)


def evaluate_reply(instruction: Message, num_examples: int, loss: float, acc: float,
                   extra: Mapping[str, float | int] | None = None) -> Message:
    """The reply of a ClientApp to an evaluate instruction."""
    rec = MetricRecord({**dict(extra or {}), NUM_EXAMPLES: int(num_examples),
                        EVAL_LOSS: float(loss), EVAL_ACC: float(acc)})
    return Message(RecordDict({METRICS: rec}), reply_to=instruction)


def query_reply(instruction: Message, partition_id: int, num_partitions: int,
                num_examples: int | None = None) -> Message:
    """The reply of a ClientApp to a partition-id query (with the partition's training
    size when given: the most ``num-examples`` its train replies may claim)."""
    rec = MetricRecord({PARTITION_ID: int(partition_id), NUM_PARTITIONS: int(num_partitions)})
    if num_examples is not None:
        rec[NUM_EXAMPLES] = int(num_examples)
    return Message(RecordDict({METRICS: rec}), reply_to=instruction)


def metric_record(values: Mapping[str, float | int]) -> MetricRecord:
    """A MetricRecord of scalar values."""
    return MetricRecord({k: v for k, v in values.items()})


__all__ = [
    "ARRAYS",
    "ASK",
    "BATCH_SIZE",
    "CONFIG",
    "EVAL_ACC",
    "EVAL_LOSS",
    "FLOWER_TRAIN_LOSS",
    "LOCAL_EPOCHS",
    "LOCAL_STEPS",
    "LR",
    "METRICS",
    "MODEL_PREFIX",
    "MOMENTUM",
    "NUM_EXAMPLES",
    "NUM_PARTITIONS",
    "PARTITION_ID",
    "PROXIMAL_MU",
    "SERVER_ROUND",
    "STATE_PREFIX",
    "STATE_SCOPE",
    "SUPERLINK_NODE_ID",
    "TRAINER",
    "TRAIN_LOSS",
    "WEIGHT_DECAY",
    "config_record",
    "evaluate_reply",
    "extra_models",
    "from_record",
    "message",
    "metric_record",
    "metrics_of",
    "model_bytes",
    "model_key",
    "model_record",
    "query_message",
    "query_reply",
    "settings",
    "to_record",
    "train_reply",
]
