"""fedsys's in-process Grid (``fedsys_launch/engines/inprocess.py``, ``fedsys_launch/engines/actor_isolation.py``): node ids and contexts, push, pull and
send-and-receive with Flower's metadata, error replies as Flower's simulation makes them,
each node's state across rounds, what a ClientApp call may not change for the server, and
messages Flower's LinkState refuses or lets expire.  Tiny ClientApps, no torch training."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import get_fused_config_from_dir
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from fedsys_launch.config_schema import load
from fedsys_launch.engines import inprocess
from fedsys_launch.engines.actor_isolation import actor_threads
from fedsys_launch.engines.inprocess import InProcessGrid, make_grid, node_contexts, node_ids
from fedsys_launch.engines.simulation import write_app_dir

ROOT = Path(__file__).resolve().parents[2]
RUN_CONFIG = {"a-key": 1, "b.key": "x"}

app = ClientApp()
#: What the last call saw: its node id in TaskIdentity, the message it got
seen: dict[str, object] = {}


@app.train()
def _train(msg: Message, context: Context) -> Message:
    """Count this node's rounds in its state; fail on demand; echo the partition."""
    seen["task-node"] = TaskIdentity.node_id
    seen["message"] = msg
    cfg = msg.content["config"]
    counter = context.state.get("counter", ConfigRecord({"n": 0}))
    counter["n"] = int(counter["n"]) + 1
    context.state["counter"] = counter
    if cfg.get("fail"):
        raise RuntimeError("injected failure")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
        torch.manual_seed(123)
        np.random.seed(5)  # noqa: NPY002
        random.seed(5)
    if cfg.get("mutate"):
        msg.content["config"]["mutated"] = True
        context.run_config["a-key"] = 2
    if cfg.get("sleep"):
        time.sleep(float(cfg["sleep"]))
    if cfg.get("wrong-reply"):
        return Message(RecordDict(), dst_node_id=1, message_type="train")
    return Message(RecordDict({"metrics": MetricRecord({
        "partition-id": int(context.node_config["partition-id"]),
        "rounds": int(counter["n"])})}), reply_to=msg)


def _grid(n: int = 3) -> InProcessGrid:
    from flwr.supercore.run import Run

    contexts = node_contexts(node_ids(n), inprocess.RUN_ID, RUN_CONFIG)
    return InProcessGrid(app, contexts, Run.create_empty(run_id=inprocess.RUN_ID))


def _train_msg(node: int, ttl: float | None = None, **config: object) -> Message:
    return Message(RecordDict({"config": ConfigRecord(dict(config))}), dst_node_id=node,
                   message_type="train", ttl=ttl)


@pytest.fixture(autouse=True)
def _server_identity():
    """The ServerApp's task identity, as :func:`fedsys_launch.engines.inprocess.simulate_inprocess` sets it."""
    TaskIdentity.task_id, TaskIdentity.run_id = 1, inprocess.RUN_ID
    TaskIdentity.node_id = SUPERLINK_NODE_ID


def test_node_ids_are_distinct_fixed_64_bit_and_never_the_superlinks():
    ids = node_ids(200)
    assert len(set(ids)) == 200 and ids == node_ids(200) and ids[:5] == node_ids(5)
    assert all(1 < i < 2**64 for i in ids) and max(ids) > 2**62
    assert node_ids(3, seed=1) != node_ids(3)


def test_nodes_get_flowers_contexts_and_the_run_config_flower_reads_back(tmp_path):
    cfg = load(ROOT / "configs" / "default.yaml", [])
    grid = make_grid(cfg, app, {})
    ids = grid.get_node_ids()
    assert ids == node_ids(20) and [n.node_id for n in grid.get_nodes()] == ids
    for i, n in enumerate(ids):
        ctx = grid.contexts[n]
        assert (ctx.node_id, ctx.run_id) == (n, inprocess.RUN_ID)
        assert ctx.node_config == {"partition-id": i, "num-partitions": 20}
        assert len(ctx.state) == 0
    # what Flower's simulation gives its clients: the app's pyproject.toml read back
    flower = get_fused_config_from_dir(write_app_dir(cfg, tmp_path), {})
    mine = grid.contexts[ids[0]].run_config
    assert mine == flower and {k: type(v) for k, v in mine.items()} == {
        k: type(v) for k, v in flower.items()}
    assert grid.run.run_id == inprocess.RUN_ID and grid.client_side.state.threads == 1


def test_actor_threads_as_ray_sets_them():
    assert actor_threads(1.0, {}) == 1
    assert actor_threads(2.7, {}) == 2
    assert actor_threads(0.5, {}) == 1
    assert actor_threads(1.0, {"OMP_NUM_THREADS": "4"}) == 4


def test_push_then_pull_gives_replies_with_flowers_metadata():
    grid = _grid()
    nodes = grid.get_node_ids()
    t0 = time.time()
    msgs = [_train_msg(n) for n in nodes]
    ids = grid.push_messages(msgs)
    assert len(set(ids)) == 3 and all(ids)
    assert [m.metadata.message_id for m in msgs] == ids
    assert all(m.metadata.delivered_at for m in msgs)  # taken by the node, as Flower marks it
    replies = grid.pull_messages(ids)
    assert len(replies) == 3
    for r, m, n in zip(sorted(replies, key=lambda r: ids.index(r.metadata.reply_to_message_id)),
                       msgs, nodes, strict=True):
        md = r.metadata
        assert not r.has_error()
        assert md.reply_to_message_id == m.metadata.message_id and md.message_id not in ids
        assert (md.src_node_id, md.dst_node_id) == (n, SUPERLINK_NODE_ID)
        assert md.run_id == inprocess.RUN_ID and md.message_type == "train"
        assert md.group_id == m.metadata.group_id and md.delivered_at
        assert t0 <= m.metadata.created_at <= md.created_at
        assert 0 < md.ttl <= m.metadata.ttl
        assert r.content["metrics"]["partition-id"] == nodes.index(n)
    # answered once: a second pull of the same ids gets Flower's MESSAGE_UNAVAILABLE
    again = grid.pull_messages(ids)
    assert [r.error.code for r in again] == [ErrorCode.MESSAGE_UNAVAILABLE] * 3
    assert all(r.metadata.src_node_id == SUPERLINK_NODE_ID for r in again)
    assert sorted(r.metadata.reply_to_message_id for r in again) == sorted(ids)


def test_send_and_receive_returns_every_reply_at_once_and_state_persists_per_node():
    grid = _grid()
    nodes = grid.get_node_ids()
    for rnd in (1, 2, 3):
        chosen = nodes if rnd != 2 else nodes[:1]  # node 0 trains in every round
        t0 = time.monotonic()
        replies = grid.send_and_receive([_train_msg(n) for n in chosen], timeout=600)
        assert time.monotonic() - t0 < 5
        rounds = {r.metadata.src_node_id: r.content["metrics"]["rounds"] for r in replies}
        assert rounds == {n: (rnd if n == nodes[0] else min(rnd, 2)) for n in chosen}
    assert int(grid.contexts[nodes[0]].state["counter"]["n"]) == 3
    assert int(grid.contexts[nodes[1]].state["counter"]["n"]) == 2


def test_a_large_federation_keeps_the_contexts_of_the_nodes_that_trained_only():
    """100,000 nodes: each context is made when asked for (its partition, an empty state,
    the one run config), and only those of nodes whose call succeeded are kept."""
    from flwr.supercore.run import Run

    ids = list(range(10, 100_010))
    contexts = node_contexts(ids, inprocess.RUN_ID, RUN_CONFIG)
    assert len(contexts) == 100_000 and not contexts.made and 9 not in contexts
    c = contexts[14]
    assert c.node_config == {"partition-id": 4, "num-partitions": 100_000} and len(c.state) == 0
    assert c.run_config == RUN_CONFIG and c.run_config is contexts[15].run_config
    with pytest.raises(KeyError):
        contexts[9]
    grid = InProcessGrid(app, contexts, Run.create_empty(run_id=inprocess.RUN_ID))
    replies = grid.send_and_receive([_train_msg(n) for n in (20, 30)] + [_train_msg(40, fail=True)])
    assert len(replies) == 3 and sorted(contexts.made) == [20, 30]
    assert int(contexts[20].state["counter"]["n"]) == 1 and len(contexts[40].state) == 0
    # a ClientApp that changes the run config is refused, and the shared dict is untouched
    grid.send_and_receive([_train_msg(50, mutate=True)])
    assert contexts.run_config == RUN_CONFIG and 50 not in contexts.made


def test_a_clientapp_that_raises_gives_flowers_error_reply_and_its_state_change_is_lost(caplog):
    grid = _grid()
    n = grid.get_node_ids()[1]
    grid.send_and_receive([_train_msg(n)])
    msg = _train_msg(n, fail=True)
    with caplog.at_level(logging.ERROR, logger="flwr"):
        (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and not reply.has_content()
    assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert reply.error.reason == (
        "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException "
        "ClientAppException occurred. Message: injected failure'>")
    md = reply.metadata
    assert (md.src_node_id, md.dst_node_id) == (n, SUPERLINK_NODE_ID)
    assert md.reply_to_message_id == msg.metadata.message_id
    assert any("injected failure" in r.getMessage() for r in caplog.records)
    # the failed call's count is not kept (Flower keeps the context of a call that raised
    # as it was); the node goes on
    assert int(grid.contexts[n].state["counter"]["n"]) == 1
    (ok,) = grid.send_and_receive([_train_msg(n)])
    assert ok.content["metrics"]["rounds"] == 2


def test_a_changed_run_config_is_an_unknown_error_and_the_message_is_the_nodes_own_copy():
    grid = _grid()
    n = grid.get_node_ids()[0]
    msg = _train_msg(n, mutate=True)
    (reply,) = grid.send_and_receive([msg])
    assert reply.error.code == ErrorCode.UNKNOWN
    assert "The `run_config` field of the `Context` object cannot be modified" in reply.error.reason
    assert grid.contexts[n].run_config == RUN_CONFIG
    assert "mutated" not in msg.content["config"]  # the ClientApp changed its own copy
    assert seen["message"] is not msg


def test_a_call_runs_as_the_node_and_leaves_the_servers_threads_and_generators():
    grid = _grid()
    n = grid.get_node_ids()[2]
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    random.seed(7)
    threads = torch.get_num_threads()
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())  # noqa: NPY002
    grid.send_and_receive([_train_msg(n, threads=threads + 1)])
    assert seen["task-node"] == n and TaskIdentity.node_id == SUPERLINK_NODE_ID
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), before[0])
    assert (np.random.get_state()[1] == before[1]).all() and random.getstate() == before[2]  # noqa: NPY002
    # the clients keep theirs from call to call, as a Ray actor does
    assert grid.client_side.state.threads == threads + 1


def test_unknown_node_expired_message_and_a_refused_reply_get_no_reply(caplog):
    grid = _grid()
    n = grid.get_node_ids()[0]
    with caplog.at_level(logging.ERROR, logger="flwr"):
        ids = grid.push_messages([_train_msg(12345), _train_msg(n)])
        assert ids[0] == "" and ids[1]
        assert "invalid destination node ID 12345" in caplog.text
        assert grid.send_and_receive([_train_msg(12345)], timeout=60) == []
        # a reply Flower's LinkState would not store (it replies to no instruction)
        t0 = time.monotonic()
        assert grid.send_and_receive([_train_msg(n, **{"wrong-reply": True})], timeout=60) == []
        assert time.monotonic() - t0 < 5 and "Reply of node" in caplog.text
    with pytest.raises(ValueError, match="Invalid message"):  # pushed twice
        grid.push_messages([grid.instructions[ids[1]]])


def test_a_message_past_its_ttl_gets_flowers_message_unavailable():
    grid = _grid()
    n = grid.get_node_ids()[0]
    msg = _train_msg(n, ttl=0.3)
    (mid,) = grid.push_messages([msg])
    time.sleep(0.4)  # the round's deadline passed before the pull
    (reply,) = grid.pull_messages([mid])
    assert reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert reply.metadata.reply_to_message_id == mid
    assert reply.metadata.src_node_id == SUPERLINK_NODE_ID
    # a node slower than the instruction's TTL: its reply cannot be stored (its TTL would
    # end before it began), and the pull says the message is unavailable
    slow = _train_msg(n, ttl=0.2, sleep=0.3)
    (sid,) = grid.push_messages([slow])
    (late,) = grid.pull_messages([sid])
    assert late.error.code == ErrorCode.MESSAGE_UNAVAILABLE
