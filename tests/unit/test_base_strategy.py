"""Base-class behaviour with mock replies in Flower's style (no runtime).

``ReplyGrid`` stands in for Flower's Grid only to hand out node ids and answer the
partition-id QUERY; train replies are built by the test with
``Message(content, reply_to=instruction)`` exactly as a ClientApp builds them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

from fedsys import flwr_io
from fedsys.aggregate import weighted_average
from fedsys.config import build
from strategies.base import FedsysStrategy, NodesUnavailableError
from strategies.fedavg import FedAvgStrategy

NODES = {101: 0, 205: 1, 333: 2, 478: 3}  # node id -> partition id


class ReplyGrid:
    """Minimal Grid: node ids, and answers to QUERY messages."""

    def __init__(self, nodes: dict[int, int]) -> None:
        self.nodes = nodes
        self.outbox: dict[str, Message] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for m in messages:
            mid = str(uuid.uuid4())
            m.metadata.__dict__["_message_id"] = mid
            self.outbox[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        out = []
        for i in list(ids):
            m = self.outbox.pop(i)
            pid = self.nodes[m.metadata.dst_node_id]
            out.append(Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=m))
        return out


def model(v: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32), "b": np.full(3, v, np.float32),
            "n": np.array(7, dtype=np.int64)}


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 3,
            "num-server-rounds": 2, "seed": 3, "round-timeout": 2.0, "node-wait-timeout": 0.5}
    return build({**base, **kw})


def configured(strategy: FedsysStrategy, grid: ReplyGrid, rnd: int = 1) -> list[Message]:
    msgs = list(strategy.configure_train(rnd, flwr_io.to_record(model(1.0)), ConfigRecord(), grid))
    grid.push_messages(msgs)  # gives each instruction its message id, as the runtime does
    grid.outbox.clear()
    return msgs


def reply(msg: Message, params: dict[str, np.ndarray] | None = None, **metrics: float) -> Message:
    pid = NODES[msg.metadata.dst_node_id]
    m = {"partition-id": pid, "num-examples": 10 * (pid + 1), "train-loss": 0.5, **metrics}
    content = RecordDict({"arrays": ArrayRecord({k: flwr_io.Array(v) for k, v in (params or model(pid)).items()}),
                          "metrics": MetricRecord(m)})
    return Message(content, reply_to=msg)


def test_each_node_gets_a_fresh_recorddict_and_the_round_config():
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    assert len(msgs) == 3
    assert len({id(m.content) for m in msgs}) == 3
    assert len({id(m.content["config"]) for m in msgs}) == 3
    for m in msgs:
        c = m.content["config"]
        assert c["server-round"] == 1 and c["trainer"] == "sgd" and c["lr"] == s.cfg.lr
        assert m.metadata.message_type == MessageType.TRAIN


def test_sampling_is_seeded_by_partition_id_not_node_id():
    a = FedAvgStrategy(cfg()).sample(ReplyGrid(NODES), 5, 3)
    renamed = {n + 1000: p for n, p in NODES.items()}  # same partitions, new node ids
    b = FedAvgStrategy(cfg()).sample(ReplyGrid(renamed), 5, 3)
    assert sorted(a.values()) == sorted(b.values())
    picks = {tuple(sorted(FedAvgStrategy(cfg(seed=s)).sample(ReplyGrid(NODES), 5, 2).values()))
             for s in range(12)}
    assert len(picks) > 1  # the seed matters


def test_waiting_for_nodes_times_out_with_a_clear_error():
    s = FedAvgStrategy(cfg(**{"clients-per-round": 4, "min-available-clients": 3}))
    with pytest.raises(NodesUnavailableError, match="only 2 of 3 required"):
        s.sample(ReplyGrid({1: 0, 2: 1}), 1, 4)


def test_after_the_wait_a_round_goes_on_with_enough_nodes(caplog):
    s = FedAvgStrategy(cfg(**{"clients-per-round": 4, "min-available-clients": 2}))
    chosen = s.sample(ReplyGrid({1: 0, 2: 1}), 1, 4)
    assert chosen == {1: 0, 2: 1}
    assert any("2 of 4 wanted nodes" in r.getMessage() for r in caplog.records)


def test_good_replies_are_aggregated_with_example_weights():
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    arrays, metrics = s.aggregate_train(1, [reply(m) for m in msgs])
    assert arrays is not None and metrics is not None
    pids = [NODES[m.metadata.dst_node_id] for m in msgs]
    want = weighted_average([model(p) for p in pids], [10 * (p + 1) for p in pids])
    got = flwr_io.from_record(arrays)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
    assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: {k: v for k, v in p.items() if k != "b"}, "missing arrays"),
        (lambda p: {**p, "w": np.zeros((3, 2), np.float32)}, "shape"),
        (lambda p: {**p, "w": p["w"].astype(np.float64)}, "dtype"),
        (lambda p: {**p, "b": np.array([0, np.nan, 0], np.float32)}, "NaN or Inf"),
        (lambda p: {**p, "b": np.array([np.inf, 0, 0], np.float32)}, "NaN or Inf"),
        (lambda p: {**p, "extra": np.zeros(1, np.float32)}, "unexpected arrays"),
    ],
)
def test_malformed_update_is_rejected_and_the_round_goes_on(mutate, reason, caplog):
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    bad_pid = NODES[msgs[0].metadata.dst_node_id]
    replies = [reply(msgs[0], mutate(model(bad_pid)))] + [reply(m) for m in msgs[1:]]
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None
    assert metrics["clients-ok"] == 2 and metrics["clients-rejected"] == 1
    (rj,) = s.last_rejections
    assert rj.partition_id == bad_pid and reason in rj.reason
    assert any(reason in r.getMessage() and f"client {bad_pid}" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [({"num-examples": float("nan")}, "num-examples"), ({"num-examples": 0}, "num-examples"),
     ({"partition-id": 3}, "echoes partition-id"), ({"train-loss": float("inf")}, "NaN or Inf")],
)
def test_bad_metrics_are_rejected(metrics, reason):
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    if metrics.get("partition-id") == NODES[msgs[0].metadata.dst_node_id]:
        metrics = {"partition-id": (metrics["partition-id"] + 1) % 4}
    s.aggregate_train(1, [reply(msgs[0], **metrics)])
    assert reason in s.last_rejections[0].reason


def test_reply_without_arrays_or_keys_is_rejected():
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    no_arrays = Message(RecordDict({"metrics": MetricRecord({"partition-id": NODES[msgs[0].metadata.dst_node_id],
                                                             "num-examples": 5})}), reply_to=msgs[0])
    no_pid = Message(RecordDict({"arrays": flwr_io.to_record(model()),
                                 "metrics": MetricRecord({"num-examples": 5})}), reply_to=msgs[1])
    s.aggregate_train(1, [no_arrays, no_pid])
    reasons = [r.reason for r in s.last_rejections]
    assert any("no ArrayRecord" in r for r in reasons)
    assert any("lack 'partition-id'" in r for r in reasons)


def test_error_reply_from_the_superlink_is_mapped_to_its_node():
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    err = Message(Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable"), reply_to=msgs[0])
    err.metadata.__dict__["_src_node_id"] = 1  # the SuperLink answers for a dead node
    _arrays, metrics = s.aggregate_train(1, [err, *[reply(m) for m in msgs[1:]]])
    assert metrics["clients-ok"] == 2
    (rj,) = s.last_rejections
    assert rj.node_id == msgs[0].metadata.dst_node_id
    assert rj.partition_id == NODES[msgs[0].metadata.dst_node_id]
    assert "code 5" in rj.reason


def test_missing_reply_is_logged_and_all_rejected_keeps_the_model():
    s = FedAvgStrategy(cfg())
    configured(s, ReplyGrid(NODES))
    before = {k: v.copy() for k, v in s.params.items()}
    arrays, metrics = s.aggregate_train(1, [])
    assert arrays is None and metrics["clients-rejected"] == 3
    assert all("no reply" in r.reason for r in s.last_rejections)
    for k in before:
        np.testing.assert_array_equal(s.params[k], before[k])


def test_duplicate_reply_is_rejected():
    s = FedAvgStrategy(cfg())
    msgs = configured(s, ReplyGrid(NODES))
    r = reply(msgs[0])
    _, metrics = s.aggregate_train(1, [r, r, *[reply(m) for m in msgs[1:]]])
    assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 1


def test_state_dict_roundtrip_and_strategy_check():
    s = FedAvgStrategy(cfg())
    s.params, s.round, s.history = model(2.0), 4, [{"round": 4, "accuracy": 0.5}]
    t = FedAvgStrategy(cfg())
    t.load_state_dict(s.state_dict())
    assert t.round == 4 and t.history == s.history
    np.testing.assert_array_equal(t.params["w"], s.params["w"])
    from strategies.fedprox import FedProxStrategy

    with pytest.raises(ValueError, match="fedavg"):
        FedProxStrategy(cfg()).load_state_dict(s.state_dict())


def test_fedprox_sends_its_trainer_and_mu():
    from strategies.fedprox import FedProxStrategy

    s = FedProxStrategy(cfg(**{"fedprox.mu": 0.25}))
    c = configured(s, ReplyGrid(NODES))[0].content["config"]
    assert c["trainer"] == "fedprox" and c["trainer.mu"] == 0.25
