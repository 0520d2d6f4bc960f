"""Issue 66 item 3: one reply pipeline (strategies.replies), in the order a reply is judged
(decode, identity, shape and values, bounds, wrappers), each step a pure function of the
reply and the round, its refusals one list.  Replies are built as a ClientApp builds them
(``Message(content, reply_to=instruction)``)."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from flwr.app import Message, MessageType, MetricRecord, RecordDict

from fedsys import protocol
from fedsys.params import distance
from fedsys.validation import ClientUpdate, Rejection
from strategies import replies as pipeline
from strategies.nodes import Reports
from strategies.replies import ReplyPolicy, RoundView


def model(v: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32)}


def policy(**kw) -> ReplyPolicy:
    base = dict(method="fedcda", weighted_by_key="num-examples", train_loss_key="train-loss",
                max_examples_ratio=100.0, max_update_ratio=20.0, max_weight_share=0.5,
                required={}, tell=lambda *a: None)
    return ReplyPolicy(**{**base, **kw})


def exchange(nodes: dict[int, int], sent_model=None):
    """Instructions to ``nodes`` (node -> sampled key), with ids as the runtime gives them."""
    sent, payloads = {}, {}
    for node in nodes:
        m = protocol.message(node, MessageType.TRAIN, sent_model or model(), {})
        m.metadata.__dict__["_message_id"] = f"m{node}"
        sent[f"m{node}"] = m
        payloads[node] = sent_model or model()
    return sent, payloads


def reply(instr: Message, v: float = 1.1, **metrics) -> Message:
    m = {"num-examples": 10, "train-loss": 0.5, **metrics}
    return Message(RecordDict({"arrays": protocol.to_record(model(v)),
                               "metrics": MetricRecord(m)}), reply_to=instr)


def view(nodes: dict[int, int], **kw) -> tuple[RoundView, dict]:
    sent, payloads = exchange(nodes)
    return RoundView(sent, dict(nodes), payloads, **kw), sent


def test_each_step_in_turn_names_the_first_thing_wrong() -> None:
    rnd, sent = view({5: 5, 6: 6})
    p = policy()
    # 1. decode: the records (a metric that is not a number) before anything else
    bad = Message(RecordDict({"arrays": protocol.to_record(model(np.nan)),
                              "metrics": MetricRecord({"num-examples": 10, "train-loss": [1.0],
                                                       "partition-id": 6})}),
                  reply_to=sent["m5"])
    got = pipeline.decode(bad, rnd, p)
    assert isinstance(got, Rejection) and got.reason == "metric(s) ['train-loss'] are not numbers"
    # 2. identity before shape and values: a NaN model claiming another node's partition
    d = pipeline.decode(reply(sent["m5"], np.nan, **{"partition-id": 6}), rnd, p)
    assert isinstance(d, pipeline.Decoded)
    who = pipeline.identify(d, {6: 6})
    assert isinstance(who, Rejection) and who.reason == "reply echoes partition-id 6, which node 6 reported"
    # 3. shape and values once the reply is who it says
    assert pipeline.identify(d, {}) == 6
    got = pipeline.check_values(d, 6, rnd.payloads[5], "num-examples")
    assert isinstance(got, Rejection) and got.reason == "array 'w' holds NaN or Inf"
    ok = pipeline.check_values(pipeline.decode(reply(sent["m5"]), rnd, p), 5, rnd.payloads[5],
                               "num-examples")
    assert isinstance(ok, ClientUpdate) and ok.partition_id == 5 and ok.num_examples == 10
    # the rest of 3: a node's second reply; a metric the method needs
    assert pipeline.screen_reply(ok, {5}, p).reason == "duplicate reply"
    need = policy(required={"loss-gap": ("gap_key", "the cache's order")})
    assert pipeline.screen_reply(ok, set(), need).reason == \
        "reply metrics lack 'loss-gap', which fedcda needs"


def test_judging_is_pure_and_the_verdict_says_what_the_run_learnt() -> None:
    rnd, sent = view({5: 5, 6: 6, 7: 7}, earlier=(0.5,))
    before = copy.deepcopy((dict(rnd.reported), rnd.earlier, {k: v.copy() for k, v in rnd.payloads.items()}))
    replies = [reply(sent["m5"], 1.1, **{"partition-id": 0}), reply(sent["m6"], 1.2),
               reply(sent["m7"], 1.3, **{"partition-id": 2})]
    a = pipeline.judge(replies, rnd, policy())
    b = pipeline.judge(replies, rnd, policy())
    assert (dict(rnd.reported), rnd.earlier) == before[:2]          # nothing written
    assert all(np.array_equal(rnd.payloads[k]["w"], before[2][k]["w"]) for k in rnd.payloads)
    assert [(u.node_id, u.partition_id) for u in a.updates] == [(5, 0), (7, 2), (6, 6)]
    assert [(u.node_id, u.partition_id) for u in b.updates] == [(5, 0), (7, 2), (6, 6)]
    assert a.refused == b.refused == [] and a.reported == {5: 0, 7: 2}
    # three replies bound each other: every accepted norm joins the history
    assert a.norms == [pytest.approx(distance(model(v), model())) for v in (1.1, 1.2, 1.3)]


def test_the_refusals_are_one_list_in_the_order_of_the_steps() -> None:
    rnd, sent = view({1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8}, declared={4: 10})
    replies = [
        reply(sent["m8"], 1.2), reply(sent["m7"], 1.1),                  # usable
        reply(sent["m1"], 1.0 + 100.0),                                  # 4. far longer update
        reply(sent["m2"], np.nan),                                       # 3. NaN model
        reply(sent["m3"], 1.1, **{"partition-id": 1.5}),                 # 2. not a whole id
        reply(sent["m4"], 1.2, **{"num-examples": 11}),                  # 4. above its declared 10
        Message(RecordDict({"metrics": MetricRecord({"num-examples": 3})}), reply_to=sent["m5"]),  # 1.
    ]                                                                    # node 6: silent

    def wrappers(ok, refs):  # 5. the wrappers' step sees the usable updates, sorted
        assert [u.node_id for u in ok] == [7, 8]
        return ok[:1], [Rejection(8, 8, "a wrapper's refusal")]

    v = pipeline.judge(replies, rnd, policy(), wrappers)
    reasons = [(rj.node_id, rj.reason.split(" (")[0].split(",")[0]) for rj in v.refused]
    assert reasons == [
        (2, "array 'w' holds NaN or Inf"),
        (3, "partition-id is 1.5"),
        (5, "reply holds no ArrayRecord 'arrays'"),
        (4, "claims num-examples 11"),
        (1, "update norm 244.9"),
        (8, "a wrapper's refusal"),
        (6, "no reply before round-timeout"),
    ], reasons
    assert [u.node_id for u in v.updates] == [7]


def test_a_partition_is_learnt_from_a_well_formed_reply_only() -> None:
    rnd, sent = view({5: 5, 6: 6})
    req = policy(required={"loss-gap": ("gap_key", "why")})
    # node 5's reply has a NaN model: its claim of partition 0 is not learnt, and node 6
    # may then claim partition 0; node 6's reply lacks a needed metric but is well formed
    v = pipeline.judge([reply(sent["m5"], np.nan, **{"partition-id": 0}),
                        reply(sent["m6"], 1.1, **{"partition-id": 0})], rnd, req)
    assert v.updates == [] and v.reported == {6: 0}
    assert [rj.reason for rj in v.refused] == [
        "array 'w' holds NaN or Inf", "reply metrics lack 'loss-gap', which fedcda needs"]


def test_a_verdict_is_told_once_per_refusal_and_once_per_note(caplog) -> None:
    told: list[str] = []
    p = policy(required={"loss-gap": ("gap_key", "the cache's order")},
               tell=lambda key, *a: told.append(key))
    rnd, sent = view({5: 5, 6: 6})
    v = pipeline.judge([reply(sent["m5"]), reply(sent["m6"], **{"loss-gap": 0.1})], rnd, p)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        pipeline.tell(v, p, "fedcda")
    assert told == ["needs-loss-gap"]
    assert [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()] == [
        "[fedcda] rejected reply of client 5 (node 5): reply metrics lack 'loss-gap', which "
        "fedcda needs"]


def test_under_privacy_no_reply_bounds_another() -> None:
    rnd, sent = view({1: 1, 2: 2, 3: 3}, declared={3: 10})
    replies = [reply(sent["m1"], 1.1), reply(sent["m2"], 1.2),
               reply(sent["m3"], 101.0, **{"num-examples": 11})]
    p = policy(private=True)
    v = pipeline.judge(replies, rnd, p)
    # only the declared size bounds a claim; the far update stays, no norm is kept, no cut
    assert [u.node_id for u in v.updates] == [1, 2]
    assert [rj.reason.split(",")[0] for rj in v.refused] == ["claims num-examples 11"]
    far = pipeline.judge([*replies[:2], reply(sent["m3"], 101.0)], rnd, p)
    assert [u.node_id for u in far.updates] == [1, 2, 3] and far.norms == [] and far.cut == {}


def test_reports_name_the_holder_a_pass_over_every_node_would() -> None:
    """:class:`~strategies.nodes.Reports` answers who reported a partition as a pass over
    every node's first report (in report order) does, adds only a node's first report."""
    rng = np.random.default_rng(3)
    reports = Reports({int(n): int(p) for n, p in zip(rng.integers(0, 50, 40),
                                                              rng.integers(0, 10, 40), strict=True)})
    plain = dict(reports)
    for node, pid in zip(rng.integers(0, 80, 200), rng.integers(0, 12, 200), strict=True):
        node, pid = int(node), int(pid)
        want = next((m for m, p in plain.items() if p == pid and m != node), None)
        assert reports.holder(pid, node) == want
        reports.add(node, pid)
        plain.setdefault(node, pid)
        assert dict(reports) == plain and list(reports) == list(plain)
