"""Base-class behaviour with mock replies in Flower's style (no runtime).

``reply_grid`` (``tests/conftest.py``) stands in for Flower's Grid only to hand out node ids and answer the
partition-id QUERY; train replies are built by the test with
``Message(content, reply_to=instruction)`` exactly as a ClientApp builds them.
"""

from __future__ import annotations

from typing import Any

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

from fedsys import protocol
from fedsys.params import mean
from fedsys_launch.config_schema import build
from strategies.base import FedsysStrategy, NodesUnavailableError
from strategies.exchange import as_returned
from strategies.fedavg import FedAvgStrategy

NODES = {101: 0, 205: 1, 333: 2, 478: 3}  # node id -> partition id


def model(v: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32), "b": np.full(3, v, np.float32),
            "n": np.array(7, dtype=np.int64)}


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 3,
            "num-server-rounds": 2, "seed": 3, "round-timeout": 2.0, "node-wait-timeout": 0.5}
    return build({**base, **kw})


def configured(strategy: FedsysStrategy, grid: Any, rnd: int = 1) -> list[Message]:
    return configured_with(strategy, grid, ConfigRecord(), rnd)


def configured_with(strategy: FedsysStrategy, grid: Any, config: ConfigRecord, rnd: int = 1
                    ) -> list[Message]:
    msgs = list(strategy.configure_train(rnd, protocol.to_record(model(1.0)), config, grid))
    grid.push_messages(msgs)  # gives each instruction its message id, as the runtime does
    grid.outbox.clear()
    return msgs


def reply(msg: Message, params: dict[str, np.ndarray] | None = None, **metrics: float) -> Message:
    pid = NODES[msg.metadata.dst_node_id]
    m = {"partition-id": pid, "num-examples": 10 * (pid + 1), "train-loss": 0.5, **metrics}
    content = RecordDict({"arrays": ArrayRecord({k: protocol.Array(v) for k, v in (params or model(pid)).items()}),
                          "metrics": MetricRecord(m)})
    return Message(content, reply_to=msg)


def test_each_node_gets_a_fresh_recorddict_and_the_round_config(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    assert len(msgs) == 3
    assert len({id(m.content) for m in msgs}) == 3
    assert len({id(m.content["config"]) for m in msgs}) == 3
    for m in msgs:
        c = m.content["config"]
        assert c["server-round"] == 1 and "lr" not in c
        assert "trainer" not in c  # a fedsys run names it in its train_config (below)
        assert m.metadata.message_type == MessageType.TRAIN


@pytest.mark.parametrize(("kw", "want"), [({"strategy": "fedavg"}, "sgd"), ({"strategy": "fedprox"}, "fedprox"),
                                          ({"strategy": "fedavg", "trainer": "lss"}, "lss")])
def test_a_fedsys_run_names_its_trainer_in_the_train_config(reply_grid, kw, want):
    from fedsys_launch.config_schema import make_strategy, train_config

    conf = cfg(**kw)
    s = make_strategy(conf)
    msgs = configured_with(s, reply_grid(NODES), ConfigRecord(train_config(conf, s.trainer)))
    assert {m.content["config"]["trainer"] for m in msgs} == {want}


def test_the_callers_train_config_reaches_the_clients_unchanged_and_typed(reply_grid):
    s = FedAvgStrategy(clients_per_round=3, seed=3, node_wait_timeout=0.5)
    given = ConfigRecord({"lr": 0.5, "local-epochs": 2, "note": "x", "trainer": "mine"})
    msgs = list(s.configure_train(1, protocol.to_record(model(1.0)), given, reply_grid(NODES)))
    for m in msgs:
        c = m.content["config"]
        assert c["lr"] == 0.5 and c["local-epochs"] == 2 and isinstance(c["local-epochs"], int)
        assert c["note"] == "x" and c["trainer"] == "mine" and c["server-round"] == 1
    assert dict(given) == {"lr": 0.5, "local-epochs": 2, "note": "x", "trainer": "mine"}
    decayed = FedAvgStrategy(clients_per_round=3, lr_decay=0.5, node_wait_timeout=0.5)
    c = next(iter(decayed.configure_train(3, protocol.to_record(model(1.0)), given,
                                          reply_grid(NODES)))).content["config"]
    assert c["lr"] == 0.5 * 0.5**2  # lr_decay schedules the caller's lr


def test_sampling_is_seeded_by_partition_id_not_node_id(reply_grid):
    a = FedAvgStrategy.from_config(cfg()).sample(reply_grid(NODES), 5, 3)
    renamed = {n + 1000: p for n, p in NODES.items()}  # same partitions, new node ids
    b = FedAvgStrategy.from_config(cfg()).sample(reply_grid(renamed), 5, 3)
    assert sorted(a.values()) == sorted(b.values())
    picks = {tuple(sorted(FedAvgStrategy.from_config(cfg(seed=s)).sample(reply_grid(NODES), 5, 2).values()))
             for s in range(12)}
    assert len(picks) > 1  # the seed matters


def test_waiting_for_nodes_times_out_with_a_clear_error(reply_grid):
    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 4, "min-available-clients": 3}))
    with pytest.raises(NodesUnavailableError, match="only 2 of 3 required"):
        s.sample(reply_grid({1: 0, 2: 1}), 1, 4)


def test_after_the_wait_a_round_goes_on_with_enough_nodes(caplog, reply_grid):
    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 4, "min-available-clients": 2}))
    chosen = s.sample(reply_grid({1: 0, 2: 1}), 1, 4)
    assert chosen == {1: 0, 2: 1}
    assert any("2 of 4 wanted nodes" in r.getMessage() for r in caplog.records)


def test_good_replies_are_aggregated_with_example_weights(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    arrays, metrics = s.aggregate_train(1, [reply(m) for m in msgs])
    assert arrays is not None and metrics is not None
    pids = [NODES[m.metadata.dst_node_id] for m in msgs]
    want = mean([model(p) for p in pids], [10 * (p + 1) for p in pids])
    got = protocol.from_record(arrays)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
    assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0
    # how far the broadcast model moved: L2 over the float entries, from the model sent out
    step = np.sqrt(sum(np.sum((got[k].astype(np.float64) - model(1.0)[k]) ** 2)
                       for k in got if np.issubdtype(got[k].dtype, np.floating)))
    assert metrics["global-step"] == pytest.approx(step, rel=1e-9) and step > 0


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: {k + "_": v for k, v in p.items()}, "holds none of the arrays it was sent"),
        (lambda p: {**p, "w": np.zeros((3, 2), np.float32)}, "shape"),
        (lambda p: {**p, "w": p["w"].astype(np.float64)}, "dtype"),
        (lambda p: {**p, "b": np.array([0, np.nan, 0], np.float32)}, "NaN or Inf"),
        (lambda p: {**p, "b": np.array([np.inf, 0, 0], np.float32)}, "NaN or Inf"),
        (lambda p: {**p, "extra": np.zeros(1, np.float32)}, "unexpected arrays"),
    ],
)
def test_malformed_update_is_rejected_and_the_round_goes_on(mutate, reason, caplog, reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    bad_pid = NODES[msgs[0].metadata.dst_node_id]
    replies = [reply(msgs[0], mutate(model(bad_pid)))] + [reply(m) for m in msgs[1:]]
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None
    assert metrics["clients-ok"] == 2 and metrics["clients-rejected"] == 1
    (rj,) = s.verdict.refused
    assert rj.partition_id == bad_pid and reason in rj.reason
    assert any(reason in r.getMessage() and f"client {bad_pid}" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [({"num-examples": float("nan")}, "num-examples"), ({"num-examples": 0}, "num-examples"),
     ({"partition-id": 3}, "echoes partition-id"), ({"train-loss": float("inf")}, "NaN or Inf")],
)
def test_bad_metrics_are_rejected(metrics, reason, reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    if metrics.get("partition-id") == NODES[msgs[0].metadata.dst_node_id]:
        metrics = {"partition-id": (metrics["partition-id"] + 1) % 4}
    s.aggregate_train(1, [reply(msgs[0], **metrics)])
    assert reason in s.verdict.refused[0].reason


def test_reply_without_arrays_or_keys_is_rejected(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    no_arrays = Message(RecordDict({"metrics": MetricRecord({"partition-id": NODES[msgs[0].metadata.dst_node_id],
                                                             "num-examples": 5})}), reply_to=msgs[0])
    no_pid = Message(RecordDict({"arrays": protocol.to_record(model()),
                                 "metrics": MetricRecord({"num-examples": 5})}), reply_to=msgs[1])
    s.aggregate_train(1, [no_arrays, no_pid])
    reasons = [r.reason for r in s.verdict.refused]
    # the reply without partition-id is keyed as sampled; the third node never answered
    assert reasons == ["reply holds no ArrayRecord 'arrays'", "no reply before round-timeout"]
    assert [u.partition_id for u in s.verdict.updates] == [NODES[msgs[1].metadata.dst_node_id]]
    no_n = Message(RecordDict({"arrays": protocol.to_record(model()),
                               "metrics": MetricRecord({"train-loss": 1.0})}), reply_to=msgs[2])
    s.aggregate_train(1, [no_n])
    assert s.verdict.refused[0].reason == "reply metrics lack 'num-examples'"


def test_error_reply_from_the_superlink_is_mapped_to_its_node(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    err = Message(Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable"), reply_to=msgs[0])
    err.metadata.__dict__["_src_node_id"] = 1  # the SuperLink answers for a dead node
    _arrays, metrics = s.aggregate_train(1, [err, *[reply(m) for m in msgs[1:]]])
    assert metrics["clients-ok"] == 2
    (rj,) = s.verdict.refused
    assert rj.node_id == msgs[0].metadata.dst_node_id
    assert rj.partition_id == NODES[msgs[0].metadata.dst_node_id]
    assert "code 5" in rj.reason


def test_missing_reply_is_logged_and_all_rejected_keeps_the_model(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    configured(s, reply_grid(NODES))
    before = {k: v.copy() for k, v in s.params.items()}
    arrays, metrics = s.aggregate_train(1, [])
    assert arrays is None and metrics["clients-rejected"] == 3
    assert all("no reply" in r.reason for r in s.verdict.refused)
    for k in before:
        np.testing.assert_array_equal(s.params[k], before[k])


def test_duplicate_reply_is_rejected(reply_grid):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    r = reply(msgs[0])
    _, metrics = s.aggregate_train(1, [r, r, *[reply(m) for m in msgs[1:]]])
    assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 1


def test_state_dict_roundtrip_and_strategy_check():
    s = FedAvgStrategy.from_config(cfg())
    s.params, s.round, s.history = model(2.0), 4, [{"round": 4, "accuracy": 0.5}]
    t = FedAvgStrategy.from_config(cfg())
    t.load_state_dict(s.state_dict())
    assert t.round == 4 and t.history == s.history
    np.testing.assert_array_equal(t.params["w"], s.params["w"])
    from strategies.fedprox import FedProxStrategy

    with pytest.raises(ValueError, match="fedavg"):
        FedProxStrategy.from_config(cfg()).load_state_dict(s.state_dict())


def test_fedprox_sends_its_trainer_and_mu(reply_grid):
    from fedsys_launch.config_schema import train_config
    from strategies.fedprox import FedProxStrategy

    conf = cfg(**{"fedprox.mu": 0.25})
    s = FedProxStrategy.from_config(conf)
    msgs = list(s.configure_train(1, protocol.to_record(model(1.0)),
                                  ConfigRecord(train_config(conf, s.trainer)), reply_grid(NODES)))
    c = msgs[0].content["config"]
    assert c["trainer"] == "fedprox" and c["fedprox.mu"] == 0.25 and c["lr"] == conf.lr


# ---------------------------------------------------------------- Flower-native use


def plain_client(sent: list[Message], loss: bool = False):
    """Answers like a ClientApp from Flower's quickstart: no query handler, a train reply
    with ``arrays`` (the received model + 1) and ``num-examples`` (and, with ``loss``,
    ``train_loss``, as Flower's app template names it) only."""

    def answer(m: Message) -> Message:
        sent.append(m)
        if m.metadata.message_type == MessageType.QUERY:
            return Message(Error(code=ErrorCode.UNKNOWN, reason="No query function registered"),
                           reply_to=m)
        got = protocol.from_record(m.content["arrays"])
        new = {k: (v + 1).astype(v.dtype) for k, v in got.items()}
        met = {"num-examples": 10, **({"train_loss": 0.5} if loss else {})}  # Flower's names
        return Message(RecordDict({"arrays": protocol.to_record(new),
                                   "metrics": MetricRecord(met)}), reply_to=m)

    return answer


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedcda", "fedcross", "fedadam", "fedavgm",
                                  "fedyogi"])
def test_every_strategy_builds_like_flowers_own_without_a_run_config(name):
    from strategies import REGISTRY

    s = REGISTRY[name](fraction_train=0.5, fraction_evaluate=0.0, min_train_nodes=2,
                       min_evaluate_nodes=1, min_available_nodes=2)
    assert s.fraction_train == 0.5 and s.min_available_nodes == 2
    with pytest.raises(TypeError, match=r"'fraction_trian'\. Did you mean 'fraction_train'"):
        REGISTRY[name](fraction_trian=0.5)


def test_method_options_are_keywords_checked_with_the_declared_bounds():
    from fedsys.options import ConfigError
    from strategies.fedcda import FedCDAStrategy
    from strategies.fedcross import FedCrossStrategy

    s = FedCDAStrategy(memory=2, selection="newest")
    assert s.K == 2 and s.selection == "newest"
    with pytest.raises(TypeError, match="Did you mean 'memory'"):
        FedCDAStrategy(memroy=2)
    with pytest.raises(ConfigError, match=r"'fedcda\.memory' must be > 0"):
        FedCDAStrategy(memory=0)
    with pytest.raises(ConfigError, match="allowed values: lowest, highest, in-order"):
        FedCrossStrategy(selection="best")


def test_start_as_flower_documents_it_num_rounds_sets_imas_start_and_the_lr(reply_grid):
    from fedsys import ima
    from strategies.ima import IMA

    sent: list[Message] = []
    grid = reply_grid(NODES, plain_client(sent))
    s = IMA(FedAvgStrategy(fraction_train=0.5, min_available_nodes=2), start_fraction=0.6, window=2, lr_decay=0.5)
    res = s.start(grid, protocol.to_record(model(0.0)), num_rounds=5,
                  train_config=ConfigRecord({"lr": 0.5, "note": "mine"}))
    assert s.wrappers[0].t_s == 3  # floor(0.6 * 5), from start's num_rounds
    assert sorted(res.train_metrics_clientapp) == [1, 2, 3, 4, 5]
    assert [h["ima-active"] for h in s.history] == [0.0, 0.0, 0.0, 1.0, 1.0]  # no evaluate_fn: no round 0
    trains = [m for m in sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(trains) == 5 * 2  # max(int(0.5 * 4), 2) nodes per round
    for m in trains:
        c = m.content["config"]
        rnd = int(c["server-round"])
        assert c["note"] == "mine" and c["lr"] == ima.client_lr(rnd - 1, 0.5, 1.0, 3, 0.5)
    # plain clients report no partition-id: keyed by node id, every reply accepted, and
    # only train messages were sent (no query, which such a client cannot answer)
    assert all(h["clients-ok"] == 2 for h in s.history)
    assert s.nodes.known.partition_ids == {} and all(s.nodes.key_of(n) == n for n in NODES)
    assert {m.metadata.message_type for m in sent} == {MessageType.TRAIN, MessageType.EVALUATE}


def test_fedcda_warmup_as_a_fraction_follows_num_rounds(reply_grid):
    from strategies.fedcda import FedCDAStrategy

    s = FedCDAStrategy(fraction_train=1.0, min_available_nodes=2, warmup_fraction=0.5,
                       memory=2, batches=2)
    s.start(reply_grid(NODES, plain_client([], loss=True)), protocol.to_record(model(0.0)),
            num_rounds=4)
    assert s.warmup == 2
    assert [h["fedcda-warmup"] for h in s.history] == [1.0, 1.0, 0.0, 0.0]


def test_timeout_bounds_each_round_and_a_round_without_updates_is_logged(reply_grid, caplog):
    silent = reply_grid(NODES, answer=lambda m: None)
    silent.pull_messages = lambda ids: []  # nobody ever answers
    s = FedAvgStrategy(clients_per_round=2, min_available_nodes=2)
    res = s.start(silent, protocol.to_record(model(0.0)), num_rounds=2, timeout=0.3)
    assert sorted(res.train_metrics_clientapp) == [1, 2] and s.usable_rounds == 0
    assert all(h["clients-rejected"] == 2 for h in s.history)
    assert sum("no usable update" in r.getMessage() for r in caplog.records) == 2


def test_the_runners_callbacks_and_estimator_are_starts_keywords(reply_grid):
    """What a run hands the round loop stays the loop's: ``on_round`` gets every record,
    ``estimator_fn`` a round that made a model (its updates and that model) and adds to its
    record, and ``label`` names the strategy in the log; the strategy keeps none of them."""
    calls: list[tuple[int, int, float]] = []

    def estimator(rnd: int, updates: list[Any], new: dict[str, np.ndarray]) -> dict[str, float]:
        calls.append((rnd, len(updates), float(new["w"][0, 0])))
        return {"est-x": float(rnd)}

    seen: list[dict[str, Any]] = []
    s = FedAvgStrategy(fraction_train=0.5, fraction_evaluate=0.0)
    s.start(reply_grid(NODES, plain_client([])), protocol.to_record(model(0.0)), num_rounds=2,
            on_round=[lambda st, r: seen.append(r)], estimator_fn=estimator, label="mine")
    assert [r["est-x"] for r in seen] == [1.0, 2.0] and seen == s.history
    assert calls == [(1, 2, 1.0), (2, 2, 2.0)] and s.label == "mine"
    assert not {"hooks", "estimator_fn", "workdir"} & set(vars(s))
    silent = reply_grid(NODES, answer=lambda m: None)
    silent.pull_messages = lambda ids: []  # nobody answers: no model made, no estimate
    calls.clear()
    t = FedAvgStrategy(clients_per_round=2, fraction_evaluate=0.0)
    t.start(silent, protocol.to_record(model(0.0)), num_rounds=1, timeout=0.2, estimator_fn=estimator)
    assert calls == [] and "est-x" not in t.history[0]


def test_nodes_keyed_by_64_bit_node_ids_sample_and_select_exactly(reply_grid):
    """Real node ids are 64-bit (beyond numpy's int64 and float64's exact range)."""
    from strategies.fedcda import FedCDAStrategy

    big = [2**64 - 3, 2**63 + 5, 12345678901234567890, 2**62 + 1]
    sent: list[Message] = []
    s = FedCDAStrategy(clients_per_round=3, min_available_nodes=3, warmup=1, memory=2,
                       batches=2)
    s.start(reply_grid(dict.fromkeys(big, 0), plain_client(sent, loss=True)),
            protocol.to_record(model(0.0)), num_rounds=4)
    assert all(h["clients-ok"] == 3 for h in s.history)
    assert set(s.selected) <= set(big) and len(s.selected) >= 3
    assert {m.metadata.dst_node_id for m in sent} <= set(big)


# ---------------------------------------------------------------- claimed weights


def test_weight_refusals_bound_what_a_reply_may_claim():
    from fedsys.validation import weight_refusals

    # declared partition sizes are the check; within them any claim is fine
    assert weight_refusals({1: 900.0, 2: 50.0}, {1: 1000, 2: 50}, 10) == {}
    got = weight_refusals({1: 1e12, 2: 50.0}, {1: 1000, 2: 50}, 10)
    assert list(got) == [1] and "1e+12" in got[1] and "holds 1000" in got[1]
    # undeclared: leave-one-out median of the others, so one huge claim cannot hide
    got = weight_refusals({1: 1e12, 2: 10.0, 3: 30.0}, {}, 100)
    assert list(got) == [1] and "median 20" in got[1]
    assert weight_refusals({1: 1e12, 2: 10.0}, {}, 100).keys() == {1}
    assert weight_refusals({1: 1e12}, {}, 100) == {}          # alone: nothing to compare
    assert weight_refusals({1: 1e12, 2: 10.0}, {}, 0) == {}   # bound off


def test_a_reply_claiming_a_huge_num_examples_cannot_take_over_fedavg(reply_grid, caplog):
    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 3}))
    grid = reply_grid(NODES)
    msgs = configured(s, grid)
    bad = msgs[0]
    replies = [reply(m) for m in msgs[1:]]
    pid = NODES[bad.metadata.dst_node_id]
    content = RecordDict({"arrays": ArrayRecord({k: protocol.Array(v) for k, v in model(99.0).items()}),
                          "metrics": MetricRecord({"partition-id": pid, "num-examples": 10**12,
                                                   "train-loss": 50.0})})
    replies.append(Message(content, reply_to=bad))
    arrays, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["clients-ok"] == 2 and metrics["clients-rejected"] == 1
    got = protocol.from_record(arrays)
    others = [NODES[m.metadata.dst_node_id] for m in msgs[1:]]
    # two replies left, weighted 10 (p + 1) as Flower weighs them (issue 77; from issue 65 E
    # to 77 a share cap of 0.5 counted the larger claim as the smaller)
    want = mean([model(p) for p in others], [10 * (p + 1) for p in others])
    assert np.array_equal(got["w"], want["w"])
    assert metrics["train-loss"] == 0.5          # the round's loss uses the same weights
    assert "1e+12" in caplog.text and "median" in caplog.text


def test_a_node_may_not_claim_more_than_it_declared(reply_grid):
    def answer(m: Message) -> Message:  # a query answer that declares the partition's size
        pid = NODES[m.metadata.dst_node_id]
        return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid,
                                                            "num-examples": 10 * (pid + 1)})}),
                       reply_to=m)

    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 3}))
    grid = reply_grid(NODES, answer=answer)
    msgs = configured(s, grid)
    assert s.nodes.known.num_examples == {n: 10 * (p + 1) for n, p in NODES.items() if n in s.nodes.known.num_examples}
    honest = [reply(m) for m in msgs[1:]]
    pid = NODES[msgs[0].metadata.dst_node_id]
    greedy = reply(msgs[0], **{"num-examples": 10 * (pid + 1) + 1})
    verdict = s.validate([*honest, greedy])
    updates, rejected = verdict.updates, verdict.refused
    assert len(updates) == 2 and [r.node_id for r in rejected] == [msgs[0].metadata.dst_node_id]
    assert "but its partition holds" in rejected[0].reason


@pytest.mark.parametrize(("code", "retries", "asked_again"), [
    (ErrorCode.REPLY_MESSAGE_UNAVAILABLE, 1, True),   # lost on the way: asked again
    (ErrorCode.MESSAGE_UNAVAILABLE, 1, True),
    (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, 1, False),  # the client's own failure: refused
    (ErrorCode.REPLY_MESSAGE_UNAVAILABLE, 0, False),  # transport-retries 0: refused
])
def test_a_reply_lost_on_the_way_is_asked_for_again(reply_grid, caplog, code, retries,
                                                     asked_again):
    tries: dict[int, int] = {}
    victim = 205

    def answer(m: Message) -> Message:
        node = m.metadata.dst_node_id
        if m.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"metrics": MetricRecord({"partition-id": NODES[node]})}),
                           reply_to=m)
        tries[node] = tries.get(node, 0) + 1
        if node == victim and tries[node] == 1:
            return Message(Error(code, "Reply message objects are unavailable."), reply_to=m)
        return reply(m)

    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 4, "transport-retries": retries}))
    s.params = model(1.0)
    with caplog.at_level("WARNING"):
        got = s.run_round(reply_grid(NODES, answer=answer), 1, ConfigRecord())
    assert tries[victim] == (2 if asked_again else 1)
    assert all(n == victim or t == 1 for n, t in tries.items())  # nobody else twice
    assert got["clients-ok"] == (4 if asked_again else 3)
    used = sorted(NODES.values()) if asked_again else [p for n, p in NODES.items() if n != victim]
    want = mean([model(p) for p in used], [10 * (p + 1) for p in used])
    assert s.params is not None and np.array_equal(s.params["w"], want["w"])
    assert ("lost on the way" in caplog.text) == asked_again


class CountingGrid:
    """Wraps a ReplyGrid and counts the QUERY messages pushed, per node."""

    def __init__(self, grid: Any) -> None:
        self.grid, self.queries = grid, {}

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == MessageType.QUERY:
                self.queries[m.metadata.dst_node_id] = self.queries.get(m.metadata.dst_node_id, 0) + 1
        return self.grid.push_messages(messages)

    def pull_messages(self, ids):
        return self.grid.pull_messages(ids)


def test_the_next_strategy_of_a_run_starts_from_the_nodes_answers(reply_grid):
    """strategies.nodes.Known, shared by a run's strategies (fedsys_launch.apps.server_app.run_experiment):
    the second strategy asks no node again, samples as if it had asked, and asks only a
    node it has not seen."""
    from strategies.nodes import Known

    known, grid = Known(), CountingGrid(reply_grid(NODES))
    first = FedAvgStrategy.from_config(cfg())
    first.nodes.share(known)
    picked = first.sample(grid, 1, 3)
    assert grid.queries == {n: 1 for n in NODES}
    assert known.partition_ids == NODES

    second = FedAvgStrategy.from_config(cfg())
    second.nodes.share(known)
    assert second.sample(grid, 1, 3) == picked
    assert grid.queries == {n: 1 for n in NODES}  # no second query round

    grid.grid.nodes = {**{n: p for n, p in NODES.items() if n != 101}, 999: 0}  # 101 came back as 999
    third = FedAvgStrategy.from_config(cfg())
    third.nodes.share(known)
    third.sample(grid, 2, 3)
    assert grid.queries == {**{n: 1 for n in NODES}, 999: 1}
    assert 101 not in known.partition_ids and known.partition_ids[999] == 0


# ---------------------------------------------------------------- a Flower user's client


def flower_client(sent: list[Message], pid_of: dict[int, int] | None = None,
                  extra: dict[str, Any] | None = None, loss_key: str = "train_loss"):
    """A client written from Flower's documentation: no query handler; its train reply
    holds ``arrays`` and Flower's metric names, ``partition-id`` (where ``pid_of`` gives
    one for the node) and whatever ``extra`` metrics it likes."""

    def answer(m: Message) -> Message:
        sent.append(m)
        if m.metadata.message_type == MessageType.QUERY:
            return Message(Error(code=ErrorCode.UNKNOWN, reason="No query function registered"),
                           reply_to=m)
        node = m.metadata.dst_node_id
        if m.metadata.message_type == MessageType.EVALUATE:
            met = {"num-examples": 10, "eval_loss": 1.0, "eval_acc": 0.5}
            return Message(RecordDict({"metrics": MetricRecord(met)}), reply_to=m)
        got = protocol.from_record(m.content["arrays"])
        met = {"num-examples": 10, loss_key: 0.5, **(extra or {})}
        if pid_of is not None and node in pid_of:
            met["partition-id"] = pid_of[node]
        return Message(RecordDict({"arrays": protocol.to_record({k: (v + 1).astype(v.dtype)
                                                                  for k, v in got.items()}),
                                   "metrics": MetricRecord(met)}), reply_to=m)

    return answer


def test_only_train_and_evaluate_messages_unless_the_caller_asks_for_the_query(reply_grid):
    sent: list[Message] = []
    s = FedAvgStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.5)
    s.start(reply_grid(NODES, flower_client(sent)), protocol.to_record(model(0.0)), num_rounds=2)
    assert {m.metadata.message_type for m in sent} == {MessageType.TRAIN, MessageType.EVALUATE}
    assert s.history[-1]["fed-eval_acc"] == 0.5  # Flower's evaluate metrics, averaged
    asked: list[Message] = []
    q = FedAvgStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0,
                       query_partitions=True)
    q.start(reply_grid(NODES, flower_client(asked)), protocol.to_record(model(0.0)), num_rounds=2)
    queries = [m.metadata.dst_node_id for m in asked if m.metadata.message_type == MessageType.QUERY]
    assert sorted(queries) == sorted(NODES)  # once per node, never again


def test_a_nodes_first_partition_id_is_its_key_and_a_later_change_is_refused(reply_grid, caplog):
    pid_of = dict(NODES)
    sent: list[Message] = []
    s = FedAvgStrategy(clients_per_round=4, min_available_nodes=4, fraction_evaluate=0.0)
    grid = reply_grid(NODES, flower_client(sent, pid_of))
    s.params = model(0.0)
    assert s.run_round(grid, 1, ConfigRecord())["clients-ok"] == 4
    assert s.nodes.known.partition_ids == NODES and [u.partition_id for u in s.verdict.updates] == [0, 1, 2, 3]
    assert {s.nodes.key_of(n) for n in NODES} == set(NODES.values())  # sampled by partition-id now
    pid_of[101] = 7         # a node changes its partition-id: refused
    pid_of[205] = 2         # one claims another node's: refused (333 reported 2 first)
    del pid_of[478]         # one stops reporting: still keyed by what it reported first
    got = s.run_round(grid, 2, ConfigRecord())
    assert got["clients-ok"] == 2 and got["clients-rejected"] == 2
    reasons = {rj.node_id: rj.reason for rj in s.verdict.refused}
    assert "echoes partition-id 7, expected 0" in reasons[101]
    assert "echoes partition-id 2, expected 1" in reasons[205]
    assert sorted(u.partition_id for u in s.verdict.updates) == [2, 3]
    assert s.nodes.known.partition_ids == NODES


def test_a_new_node_may_not_take_a_partition_another_node_reported(reply_grid):
    s = FedAvgStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0)
    s.params = model(0.0)
    grid = reply_grid({1: 0, 2: 1}, flower_client([], {1: 5, 2: 5}))
    got = s.run_round(grid, 1, ConfigRecord())
    (first,) = s.nodes.known.partition_ids  # whichever reply came first holds partition 5
    (rj,) = s.verdict.refused
    assert got["clients-ok"] == 1 and s.nodes.known.partition_ids == {first: 5}
    assert rj.node_id != first and f"which node {first} reported" in rj.reason


@pytest.mark.parametrize("extra", [{"accuracy": 0.9, "partition-id": 2}, {"val_loss": float("nan")},
                                   {"per_class": [0.1, 0.2]}, {"steps": 10**9}])
def test_extra_numeric_metrics_are_never_a_reason_to_refuse(reply_grid, extra):
    s = FedAvgStrategy(clients_per_round=1, min_available_nodes=1, fraction_evaluate=0.0)
    s.params = model(0.0)
    assert s.run_round(reply_grid({9: 0}, flower_client([], extra=extra)), 1,
                       ConfigRecord())["clients-ok"] == 1
    assert all(np.isfinite(v) for v in s.verdict.updates[0].metrics.values())


def test_the_metric_keys_are_flowers_keywords_and_a_missing_one_is_one_error(reply_grid, caplog):
    from strategies.fedcda import FedCDAStrategy

    # Flower's names by default: FedCDA reads train_loss
    s = FedCDAStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0,
                       memory=2, warmup=1, batches=1)
    s.start(reply_grid(NODES, flower_client([])), protocol.to_record(model(0.0)), num_rounds=3)
    assert all(h["clients-ok"] == 2 for h in s.history) and s.history[-1]["train_loss"] == 0.5
    # another name, given by keyword
    t = FedCDAStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0,
                       memory=2, warmup=1, batches=1, train_loss_key="loss",
                       weighted_by_key="n")
    client = flower_client([], loss_key="loss", extra={"n": 5})
    t.start(reply_grid(NODES, client), protocol.to_record(model(0.0)), num_rounds=2)
    assert all(h["clients-ok"] == 2 for h in t.history)
    # a key the replies lack: one ERROR naming it and its keyword, each round an ERROR, and
    # the run's end an ERROR summary
    caplog.clear()
    u = FedCDAStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0,
                       train_loss_key="train-loss")
    u.start(reply_grid(NODES, flower_client([])), protocol.to_record(model(0.0)), num_rounds=2)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len([e for e in errors if "train_loss_key='train-loss'" in e]) == 1
    assert len([e for e in errors if "no usable update" in e and "lack 'train-loss'" in e]) == 2
    assert any("no round of the run used a reply" in e for e in errors)
    v = FedAvgStrategy(clients_per_round=2, min_available_nodes=2, fraction_evaluate=0.0,
                       weighted_by_key="num_examples")
    caplog.clear()
    v.start(reply_grid(NODES, flower_client([])), protocol.to_record(model(0.0)), num_rounds=2)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len([e for e in errors if "weighted_by_key='num_examples'" in e]) == 1


def tutorial_client(sent: list[Message], model_key: str = "arrays", config_key: str = "config"):
    """The train and evaluate handlers of Flower's tutorial "Communicate custom Messages"
    (the quickstart's client, then a ``training_time`` metric and an object sent in a
    ConfigRecord ``train_metadata``), reading the model and the settings under the names
    its strategy sends them (``arrayrecord_key``, ``configrecord_key``)."""

    def answer(m: Message) -> Message:
        sent.append(m)
        node = m.metadata.dst_node_id
        got = protocol.from_record(m.content[model_key])
        n = 10 * (NODES[node] + 1)
        if m.metadata.message_type == MessageType.EVALUATE:
            met = {"num-examples": n, "eval_loss": 1.0, "eval_acc": 0.1 * NODES[node]}
            return Message(RecordDict({"metrics": MetricRecord(met)}), reply_to=m)
        lr = float(m.content[config_key]["lr"])
        new = {k: (v + lr).astype(v.dtype) for k, v in got.items()}
        met = {"train_loss": 0.5 + 0.1 * NODES[node], "num-examples": n,
               "training_time": float(NODES[node])}
        return Message(RecordDict({
            "arrays": protocol.to_record(new), "metrics": MetricRecord(met),
            "train_metadata": ConfigRecord({"meta": b"\x80\x04pickled", "converged": True}),
        }), reply_to=m)

    return answer


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedcda", "fedcross", "fedadam", "fedavgm",
                                  "fedyogi", "fedelmy", "oneshot-fedavg"])
def test_flowers_tutorial_client_and_keywords_work_under_every_strategy(name, reply_grid, caplog):
    """Flower's FedAvg keywords (record names, metric aggregation functions) and the
    tutorial's reply (an extra metric, an object in a ConfigRecord) under every strategy:
    every reply used, the model and settings sent under the caller's names, the client
    metrics aggregated as Flower's strategies do, or by the caller's functions."""
    from strategies import REGISTRY

    calls: list[tuple[str, int, str]] = []

    def train_aggr(contents: list[RecordDict], key: str) -> MetricRecord:
        calls.append(("train", len(contents), key))
        assert all("train_metadata" in c for c in contents)  # the whole reply, as Flower's
        times = [float(c["metrics"]["training_time"]) for c in contents]
        losses = [float(c["metrics"]["train_loss"]) for c in contents]
        return MetricRecord({"slowest": max(times), "per_class": [1.0, 2.0],
                             "train_loss": min(losses)})  # the caller's, not the mean

    def eval_aggr(contents: list[RecordDict], key: str) -> MetricRecord:
        calls.append(("evaluate", len(contents), key))
        return MetricRecord({"best_acc": max(float(c["metrics"]["eval_acc"]) for c in contents)})

    kw: dict[str, Any] = {"min_available_nodes": 4, "min_evaluate_nodes": 4}
    if name not in ("fedelmy", "oneshot-fedavg"):
        kw |= {"fraction_train": 1.0}
    if name == "fedcda":
        kw |= {"memory": 2, "warmup": 1, "batches": 1}
    # Flower's defaults: the tutorial's extra metric averaged, weighted by the examples
    sent: list[Message] = []
    s = REGISTRY[name](**kw)
    res = s.start(reply_grid(NODES, tutorial_client(sent)), protocol.to_record(model(0.0)),
                  num_rounds=2, train_config=ConfigRecord({"lr": 0.5}))
    train = [m for m in sent if m.metadata.message_type == MessageType.TRAIN]
    assert train and all(h["clients-ok"] >= 1 and h.get("clients-rejected", 0) == 0
                         for h in s.history if "clients-ok" in h), s.history
    assert "rejected" not in caplog.text
    if name == "fedelmy":  # a hop's one reply: its metrics as they are
        assert all(h["training_time"] == float(NODES[m.metadata.dst_node_id])
                   for h, m in zip(s.history, train, strict=True))
    elif name != "oneshot-fedavg" or len(s.history) > 1:
        n = sum(10 * (p + 1) for p in NODES.values())
        want = sum(10 * (p + 1) * p for p in NODES.values()) / n
        assert res.train_metrics_clientapp[s.round]["training_time"] == pytest.approx(want)
        loss = sum(10 * (p + 1) * (0.5 + 0.1 * p) for p in NODES.values()) / n  # weighted mean
        assert res.train_metrics_clientapp[s.round]["train_loss"] == pytest.approx(loss)
    # the caller's record names and aggregation functions, as with Flower's FedAvg
    sent.clear()
    caplog.clear()
    t = REGISTRY[name](**kw, arrayrecord_key="weights", configrecord_key="settings",
                       train_metrics_aggr_fn=train_aggr, evaluate_metrics_aggr_fn=eval_aggr)
    with caplog.at_level("WARNING"):
        res = t.start(reply_grid(NODES, tutorial_client(sent, "weights", "settings")),
                      protocol.to_record(model(0.0)), num_rounds=2,
                      train_config=ConfigRecord({"lr": 0.5}))
    assert all(sorted(m.content.array_records) == ["weights"]
               and sorted(m.content.config_records) == ["settings"] for m in sent)
    assert all(h.get("clients-rejected", 0) == 0 for h in t.history)
    trained = [c for c in calls if c[0] == "train"]
    assert trained and all(k == "num-examples" and n >= 1 for _, n, k in trained)
    last = res.train_metrics_clientapp[t.round]
    assert "slowest" in last and "per_class" not in last and "training_time" not in last
    if name != "fedelmy":  # a chain's last hop: one reply, its own loss
        assert last["train_loss"] == pytest.approx(0.5)  # the minimum, node 0's
    assert "share a name" not in caplog.text
    assert "non-scalar metric(s) ['per_class']" in caplog.text
    from fedsys.options import ConfigError
    for bad in ("", "model.main"):
        with pytest.raises(ConfigError, match="arrayrecord_key="):
            REGISTRY[name](arrayrecord_key=bad)
    if name not in ("fedelmy", "oneshot-fedavg"):  # the chains ask no node to evaluate
        assert ("evaluate", 4, "num-examples") in calls
        assert res.evaluate_metrics_clientapp[t.round]["best_acc"] == pytest.approx(0.3)


def test_what_a_configure_train_override_returns_is_what_is_sent(reply_grid, caplog):
    """As on Flower's strategies (``start`` sends what ``configure_train`` returns), a
    subclass's override is honoured: a node left out is not sent (nor counted missing), a
    node given its own model (personalised layers, as Flower users write it) has its reply
    checked against that model, and a key set on the config before ``super()`` reaches
    every node."""
    left_out, personal = 101, 205

    class Custom(FedAvgStrategy):
        def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                            grid: Any) -> list[Message]:
            config["mine"] = server_round
            msgs = [m for m in super().configure_train(server_round, arrays, config, grid)
                    if m.metadata.dst_node_id != left_out]
            for m in msgs:
                if m.metadata.dst_node_id == personal:  # far from the global model
                    own = {k: (v + 1000).astype(v.dtype) for k, v in
                           protocol.from_record(m.content["arrays"]).items()}
                    m.content["arrays"] = protocol.to_record(own)
            return msgs

    sent: list[Message] = []
    s = Custom(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=0.0)
    with caplog.at_level("WARNING"):
        s.start(reply_grid(NODES, plain_client(sent)), protocol.to_record(model(0.0)),
                num_rounds=2)
    assert sorted({m.metadata.dst_node_id for m in sent}) == sorted(set(NODES) - {left_out})
    assert all(m.content["config"]["mine"] == m.content["config"]["server-round"] for m in sent)
    # every sent node used: the personalised reply (its model + 1) is an update of norm
    # ~1 from what it was sent, not ~1000 from the global model (max-update-ratio 20)
    assert [h["clients-ok"] for h in s.history] == [3, 3], caplog.text
    assert [h["clients-rejected"] for h in s.history] == [0, 0], caplog.text
    # a plain run is untouched: its own exchange, nothing rebuilt
    t = FedAvgStrategy(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=0.0)
    t.params = model(0.0)
    msgs = list(t.configure_train(1, protocol.to_record(model(0.0)), ConfigRecord(),
                                  reply_grid(NODES)))
    assert as_returned(t.outgoing, msgs, "arrays", {}) is t.outgoing


def test_fedprox_sends_mu_as_flowers_fedprox_does_and_fedadam_takes_flowers_names(reply_grid):
    """A client written from Flower's FedProx documentation reads
    ``msg.content["config"]["proximal-mu"]``: fedsys's FedProx sends it (only it: a
    caller's ``fedprox.mu`` reaches the clients as the caller's keys do), from Flower's
    keyword ``proximal_mu``, else from the caller's ``fedprox.mu``, else Flower's FedProx
    default (0.0; a fedsys run config always gives its ``fedprox.mu``, default 0.01);
    FedAdam/FedYogi take Flower's names."""
    import inspect

    from flwr.serverapp.strategy import FedProx

    from fedsys.options import ConfigError
    from strategies import REGISTRY
    from strategies.fedprox import DEFAULT_MU, FedProxStrategy

    assert DEFAULT_MU == inspect.signature(FedProx).parameters["proximal_mu"].default == 0.0

    def mus(s: FedProxStrategy, given: dict[str, Any]) -> set[tuple[float, float]]:
        sent: list[Message] = []
        s.start(reply_grid(NODES, plain_client(sent)), protocol.to_record(model(0.0)),
                num_rounds=1, train_config=ConfigRecord(given))
        return {(float(m.content["config"]["proximal-mu"]),
                 float(m.content["config"].get("fedprox.mu", -1.0))) for m in sent}

    kw: dict[str, Any] = {"fraction_train": 0.5, "fraction_evaluate": 0.0}
    assert mus(FedProxStrategy(proximal_mu=0.1, **kw), {}) == {(0.1, -1.0)}
    assert mus(FedProxStrategy(**kw), {}) == {(DEFAULT_MU, -1.0)}
    assert mus(FedProxStrategy(**kw), {"fedprox.mu": 0.3}) == {(0.3, 0.3)}
    assert mus(FedProxStrategy(proximal_mu=0.3, **kw), {"fedprox.mu": 0.3}) == {(0.3, 0.3)}
    with pytest.raises(ConfigError, match=r"proximal_mu=0\.1 and the train config's fedprox\.mu=0\.3"):
        mus(FedProxStrategy(proximal_mu=0.1, **kw), {"fedprox.mu": 0.3})
    with pytest.raises(ConfigError, match="proximal_mu must be >= 0"):
        FedProxStrategy(proximal_mu=-1.0)
    # a fedsys run: the run config's fedprox.mu (its trainer reads the same number)
    assert FedProxStrategy.from_config(cfg(strategy="fedprox", **{"fedprox.mu": 0.2})).proximal_mu == 0.2
    for name in ("fedadam", "fedyogi"):
        s = REGISTRY[name](eta=0.05, beta_1=0.8, beta_2=0.9, tau=1e-4, eta_l=0.1)
        assert (s.opt.lr, s.opt.beta1, s.opt.beta2, s.opt.tau, s.eta_l) == (0.05, 0.8, 0.9, 1e-4, 0.1)
        with pytest.raises(TypeError, match="unexpected keyword argument 'lr'"):
            REGISTRY[name](eta=0.1, lr=0.2)  # the config key's name (fedopt.lr) is not one
        with pytest.raises(TypeError, match="Did you mean 'eta'"):
            REGISTRY[name](etaa=0.1)


def flower_loop(strategy: Any, grid: Any, rounds: int) -> ArrayRecord:
    """The round loop of Flower's advanced PyTorch example (its ``CustomFedAvg.start``):
    configure_train, send_and_receive, aggregate_train, configure_evaluate, ... by hand."""
    arrays = protocol.to_record(model(0.0))
    for rnd in range(1, rounds + 1):
        msgs = strategy.configure_train(rnd, arrays, ConfigRecord({"lr": 0.1}), grid)
        agg, _ = strategy.aggregate_train(rnd, grid.pull_messages(grid.push_messages(msgs)))
        arrays = agg if agg is not None else arrays
        ev = strategy.configure_evaluate(rnd, arrays, ConfigRecord(), grid)
        strategy.aggregate_evaluate(rnd, grid.pull_messages(grid.push_messages(ev)))
    return arrays


def test_a_round_loop_of_the_users_own_runs_or_says_what_it_needs(reply_grid):
    """Flower's advanced example writes its own ``start``: the strategy is then never told
    the run's length.  Options that follow it (FedCDA's warmup unset: a quarter of the run;
    IMA's start fraction) are an error naming them and the way out (``prepare``), not a
    silent FedCDA without its warmup; given in rounds, or after ``prepare``, the loop
    runs; a chain, whose hops run inside ``start``, says so."""
    from fedsys.options import ConfigError
    from strategies.fedcda import FedCDAStrategy
    from strategies.fedelmy import FedElmyStrategy
    from strategies.ima import IMA

    grid = reply_grid(NODES, flower_client([]))
    kw: dict[str, Any] = {"fraction_train": 1.0, "min_available_nodes": 4, "fraction_evaluate": 0.0}
    with pytest.raises(ConfigError, match=r"fedcda\.warmup \(unset: a quarter of the run\).*"
                                          r"strategy\.prepare\(num_rounds\)"):
        flower_loop(FedCDAStrategy(**kw), grid, 4)
    with pytest.raises(ConfigError, match=r"ima\.start-fraction"):
        flower_loop(IMA(FedAvgStrategy(**kw), window=2), grid, 4)
    s = FedCDAStrategy(**kw, memory=2, batches=1)
    s.prepare(8)  # as start(num_rounds=8) does
    flower_loop(s, grid, 8)
    assert s.warmup == 2  # a quarter of 8
    t = FedCDAStrategy(**kw, memory=2, batches=1, warmup=1)
    assert flower_loop(t, grid, 3) is not None and t.params is not None
    u = FedAvgStrategy(**kw)  # nothing follows the run's length: as Flower's FedAvg
    assert np.all(protocol.from_record(flower_loop(u, grid, 2))["w"] == 2.0)
    with pytest.raises(RuntimeError, match=r"call strategy\.start"):
        flower_loop(FedElmyStrategy(), grid, 1)


def test_a_round_without_federated_metrics_says_why(reply_grid, caplog):
    """Evaluate replies that are errors are counted with their reason each round, and
    replies without the weight (a typo in ``num-examples``) say once that no federated
    metrics can be made; good replies give Flower's weighted mean as before."""

    def answer(m: Message) -> Message:
        node = m.metadata.dst_node_id
        if m.metadata.message_type != MessageType.EVALUATE:
            return flower_client([])(m)
        if node == 101:
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                 reason="ValueError: no validation split"), reply_to=m)
        return Message(RecordDict({"metrics": MetricRecord(
            {"num_examples": 10, "eval_acc": 0.5})}), reply_to=m)  # the weight misspelt

    s = FedAvgStrategy(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=1.0,
                       min_evaluate_nodes=4)
    with caplog.at_level("WARNING"):
        res = s.start(reply_grid(NODES, answer), protocol.to_record(model(0.0)), num_rounds=2)
    assert not res.evaluate_metrics_clientapp
    lines = [r.getMessage() for r in caplog.records]
    assert [m for m in lines if "1 of 4 evaluate replies are errors (ValueError: no validation "
            "split)" in m] and len([m for m in lines if "evaluate replies are errors" in m]) == 2
    assert len([m for m in lines if "hold no finite 'num-examples'" in m]) == 1
    caplog.clear()
    t = FedAvgStrategy(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=1.0,
                       min_evaluate_nodes=4)
    with caplog.at_level("WARNING"):
        res = t.start(reply_grid(NODES, flower_client([])), protocol.to_record(model(0.0)),
                      num_rounds=1)
    assert res.evaluate_metrics_clientapp[1]["eval_acc"] == 0.5 and "evaluate" not in caplog.text


def test_a_model_without_its_batchnorm_layers_is_used_as_flowers_fedbn_sends_it(reply_grid, caplog):
    """Flower's FedBN how-to: the client leaves its batch-norm arrays out of the reply and
    keeps them.  The reply is used; the arrays it left out hold what the node was sent (so
    the mean keeps the server's), said once; a model sharing no array is refused."""
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))

    def without_b(m: Message) -> Message:
        got = protocol.from_record(m.content["arrays"])
        return reply(m, {k: np.asarray(v + 1, dtype=v.dtype) for k, v in got.items() if k != "b"})

    with caplog.at_level("INFO"):
        arrays, metrics = s.aggregate_train(1, [without_b(m) for m in msgs])
    assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0
    new = protocol.from_record(arrays)
    assert np.all(new["w"] == 2.0) and np.all(new["b"] == 1.0)  # b as sent: model(1.0)
    assert all(u.local == ("b",) for u in s.verdict.updates)
    assert len([r for r in caplog.records if "leave out arrays ['b']" in r.getMessage()]) == 1
