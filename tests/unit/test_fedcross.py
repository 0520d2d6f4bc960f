"""FedCross: cross-aggregation maths (fedsys.fedcross) and the strategy on mock replies.

Strategy tests drive ``configure_train`` / ``aggregate_train`` with a minimal Grid
(the pattern of ``test_base_strategy.py``); no Flower runtime.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from fedsys import fedcross as fc
from fedsys import protocol
from fedsys.config import ConfigError
from fedsys.params import Params, checksum, copy, mean
from fedsys_launch.config_schema import build
from strategies.fedcross import FedCrossStrategy

# ---------------------------------------------------------------------- helpers


def rand_model(rng: np.random.Generator, dtype: type = np.float64, scale: float = 1.0) -> Params:
    """A small model with a BatchNorm layer: weights, buffers and an integer counter."""
    return {
        "conv.weight": (rng.standard_normal((4, 3, 3)) * scale).astype(dtype),
        "conv.bias": (rng.standard_normal(4) * scale).astype(dtype),
        "bn.weight": (rng.standard_normal(4) * scale).astype(dtype),
        "bn.bias": (rng.standard_normal(4) * scale).astype(dtype),
        "bn.running_mean": (rng.standard_normal(4) * scale).astype(dtype),
        "bn.running_var": rng.uniform(0.5, 2, 4).astype(dtype),
        "bn.num_batches_tracked": np.array(rng.integers(0, 1000), dtype=np.int64),
        "fc.weight": (rng.standard_normal((3, 4)) * scale).astype(dtype),
    }


def models(k: int, seed: int = 0, dtype: type = np.float64) -> list[Params]:
    rng = np.random.default_rng(seed)
    return [rand_model(rng, dtype) for _ in range(k)]


def direct_cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-8))


def flat(m: Params, keys: Iterable[str]) -> np.ndarray:
    return np.concatenate([np.ravel(m[k]).astype(np.float64) for k in keys])


def code_lowest(sim: np.ndarray, j: int) -> int:
    """The authors' scan (cross_aggregation): start at j+1, replace on strict <."""
    m = len(sim)
    tag = (j + 1) % m
    for p in range(m):
        if sim[j][p] < sim[j][tag] and p != j:
            tag = p
    return tag


def code_highest(sim: np.ndarray, j: int) -> int:
    """Argmax over p != j, first found on ties (the code's scan without self)."""
    cands = [p for p in range(len(sim)) if p != j]
    tag = cands[0]
    for p in cands:
        if sim[j][p] > sim[j][tag]:
            tag = p
    return tag


# ---------------------------------------------------------------------- mixing maths


def test_cross_aggregation_formula_on_hand_made_vectors():
    v = [{"w": np.array([1.0, 0.0]), "n": np.array(5)}, {"w": np.array([0.0, 2.0]), "n": np.array(6)},
         {"w": np.array([4.0, 4.0]), "n": np.array(7)}]
    a = fc.cross_matrix(np.array([2, 0, 0]), 0.75)
    np.testing.assert_array_equal(a, [[0.75, 0, 0.25], [0.25, 0.75, 0], [0.25, 0, 0.75]])
    out = fc.mix(v, a)
    np.testing.assert_allclose(out[0]["w"], [1.75, 1.0])
    np.testing.assert_allclose(out[1]["w"], [0.25, 1.5])
    np.testing.assert_allclose(out[2]["w"], [3.25, 3.0])
    assert [int(o["n"]) for o in out] == [5, 6, 7]  # integer entries: each model's own


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_in_order_cross_aggregation_keeps_the_mean(k):
    v = models(k, seed=k)
    before = fc.uniform_mean(v)
    for rnd in range(1, 2 * k):
        c = fc.select_collaborators(None, "in-order", rnd, n=k)
        assert sorted(c.tolist()) == list(range(k))  # a permutation
        after = fc.uniform_mean(fc.mix(v, fc.cross_matrix(c, 0.9)))
        for key in before:
            np.testing.assert_allclose(after[key], before[key], rtol=1e-12, atol=1e-12)


def test_alpha_one_keeps_the_chains_separate():
    v = models(4, dtype=np.float32)
    for rule in ("in-order", "lowest", "highest"):
        sim, _ = fc.similarity(v)
        out = fc.mix(v, fc.cross_matrix(fc.select_collaborators(sim, rule, 3), 1.0))
        for o, m in zip(out, v, strict=True):
            assert checksum(o) == checksum(m)


def test_two_models_with_alpha_half_is_unweighted_fedavg():
    v = models(2, seed=1)
    c = fc.select_collaborators(fc.similarity(v)[0], "lowest", 1)
    out = fc.mix(v, fc.cross_matrix(c, 0.5))
    want = mean(v, [1.0, 1.0])
    for o in out:
        for key, val in want.items():
            if key.endswith("num_batches_tracked"):
                continue
            np.testing.assert_allclose(o[key], val, rtol=1e-15, atol=1e-15)


def test_propellers_with_all_peers_equal_the_warmup_reset():
    k = 5
    v = models(k, seed=3)
    for rnd in (1, 2, 7):
        a = fc.propeller_matrix(rnd, k, k - 1, 1.0 / k)
        np.testing.assert_allclose(a, np.full((k, k), 1.0 / k), atol=1e-15)
        mean = fc.uniform_mean(v)
        for o in fc.mix(v, a):
            for key in [*fc.trainable_keys(o), "bn.running_mean", "bn.running_var"]:
                np.testing.assert_allclose(o[key], mean[key], rtol=1e-13)
    # the default beta is 1/(P+1); P is capped at n-1
    assert fc.propeller_offsets(1, 4, 10) == [1, 2, 3]
    assert fc.propeller_offsets(3, 5, 2) == [3, 4]
    a = fc.propeller_matrix(1, 6, 2)
    np.testing.assert_allclose(np.diag(a), 1 / 3)
    np.testing.assert_allclose(a.sum(axis=1), 1.0)
    assert (a > 0).sum(axis=1).tolist() == [3] * 6


def test_dynamic_alpha_schedule():
    assert fc.dynamic_alpha(1, 0.99, 0, 0) == 0.99  # off
    vals = [fc.dynamic_alpha(r, 0.99, 10, 50) for r in (1, 11, 36, 60, 61, 200)]
    assert vals == pytest.approx([0.5, 0.5, 0.745, 0.5 + 0.49 * 49 / 50, 0.99, 0.99])
    assert all(x <= y for x, y in itertools.pairwise(vals))


def test_integer_buffers_are_never_averaged():
    v = models(3, seed=5, dtype=np.float32)
    out = fc.mix(v, fc.cross_matrix(np.array([1, 2, 0]), 0.6))
    for o, m in zip(out, v, strict=True):
        assert o["bn.num_batches_tracked"] == m["bn.num_batches_tracked"]
        assert o["bn.num_batches_tracked"].dtype == np.int64
        assert o["conv.weight"].dtype == np.float32
    mean = fc.uniform_mean(v)
    assert mean["bn.num_batches_tracked"] == max(int(m["bn.num_batches_tracked"]) for m in v)
    assert isinstance(mean["bn.num_batches_tracked"], np.ndarray)
    # BatchNorm running statistics are mixed like weights
    np.testing.assert_allclose(out[0]["bn.running_var"],
                               0.6 * v[0]["bn.running_var"] + 0.4 * v[1]["bn.running_var"], rtol=1e-6)


def test_mix_writes_into_out_and_refuses_aliasing():
    v = models(3, seed=6)
    dst = [copy(m) for m in models(3, seed=7)]
    a = fc.cross_matrix(np.array([1, 0, 1]), 0.8)
    res = fc.mix(v, a, out=dst)
    assert res[0] is dst[0] and res[0]["fc.weight"] is dst[0]["fc.weight"]
    np.testing.assert_allclose(dst[2]["fc.weight"], 0.8 * v[2]["fc.weight"] + 0.2 * v[1]["fc.weight"])
    with pytest.raises(ValueError, match="shares memory"):
        fc.mix(v, a, out=v)
    with pytest.raises(ValueError, match="own collaborator"):
        fc.cross_matrix(np.array([0, 0]), 0.9)


@pytest.mark.parametrize("mixing", ["cross", "identical-rows"])
@pytest.mark.parametrize("chunk", [3, 7, 1 << 16])  # chunks that cut entries, and whole ones
def test_cross_aggregate_is_mix_into_the_slots_plus_their_mean(chunk, mixing, monkeypatch):
    monkeypatch.setattr(fc, "MIX_CHUNK", chunk)
    k = 6
    slots = models(k, seed=20, dtype=np.float32)
    ups = {i: m for i, m in zip([0, 2, 3, 5], models(4, seed=21, dtype=np.float32), strict=True)}
    ok = sorted(ups)
    a = (fc.cross_matrix(fc.select_collaborators(None, "in-order", 2, n=4), 0.9) if mixing == "cross"
         else fc.propeller_matrix(2, 4, 3))  # 3 propellers of 4: identical rows, the mean
    before = [copy(x) for x in slots]
    want = fc.mix([ups[i] for i in ok], a)
    ids = [id(x["fc.weight"]) for x in slots]
    glob = fc.cross_aggregate(slots, ups, a)
    assert [id(x["fc.weight"]) for x in slots] == ids  # written in place
    for i in range(k):
        expect = want[ok.index(i)] if i in ups else before[i]
        assert checksum(slots[i]) == checksum(expect)
    assert checksum(glob) == checksum(fc.uniform_mean(slots))  # bit for bit
    with pytest.raises(ValueError, match="share memory"):
        fc.cross_aggregate(slots, {0: slots[0], 1: slots[1]}, fc.cross_matrix(np.array([1, 0]), 0.9))


def test_uniform_mean_of_float32_models_is_float64_accurate_to_float32_rounding():
    v = models(21, seed=22, dtype=np.float32)  # 21 = two full groups of 8 and a partial one
    got = fc.uniform_mean(v)
    for key in fc.trainable_keys(v[0]):
        exact = np.mean([m[key].astype(np.float64) for m in v], axis=0)
        np.testing.assert_allclose(got[key], exact, rtol=0, atol=4e-7 * np.abs(exact).max())


# ---------------------------------------------------------------------- selection


def test_in_order_offset_meets_everyone_once_per_k_minus_one_rounds():
    k = 6
    met = {i: [] for i in range(k)}
    for rnd in range(1, k):  # rounds 1..K-1
        c = fc.select_collaborators(None, "in-order", rnd, n=k)
        assert all(c[i] != i for i in range(k))
        for i in range(k):
            met[i].append(int(c[i]))
    assert all(sorted(m) == sorted(set(range(k)) - {i}) for i, m in met.items())
    assert fc.in_order_offset(1, k) == 1 and fc.in_order_offset(k, k) == 1  # r = 0 and r = K-1


@pytest.mark.parametrize("seed", range(6))
def test_similarity_rules_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    s = rng.standard_normal((n, n))
    if seed % 2:  # coarse values: many ties
        s = np.round(s)
    s = (s + s.T) / 2
    low = fc.select_collaborators(s, "lowest", 1)
    high = fc.select_collaborators(s, "highest", 1)
    assert low.tolist() == [code_lowest(s, j) for j in range(n)]
    assert high.tolist() == [code_highest(s, j) for j in range(n)]
    assert all(low[i] != i and high[i] != i for i in range(n))


def test_selection_on_models_against_direct_cosines():
    v = models(7, seed=11, dtype=np.float32)
    keys = fc.trainable_keys(v[0])
    direct = np.array([[direct_cos(flat(a, keys), flat(b, keys)) for b in v] for a in v])
    sim, _ = fc.similarity(v)
    assert fc.select_collaborators(sim, "lowest", 4).tolist() == [
        int(np.argmin(np.where(np.arange(7) == i, np.inf, direct[i]))) for i in range(7)]
    assert fc.select_collaborators(sim, "highest", 4).tolist() == [
        int(np.argmax(np.where(np.arange(7) == i, -np.inf, direct[i]))) for i in range(7)]


def test_selection_needs_two_models_and_a_known_rule():
    with pytest.raises(ValueError, match="at least 2"):
        fc.select_collaborators(np.ones((1, 1)), "lowest", 1)
    with pytest.raises(ValueError, match="selection rule"):
        fc.select_collaborators(np.ones((2, 2)), "random", 1)


# ---------------------------------------------------------------------- Gram / similarity


@pytest.mark.parametrize("block_bytes", [64, 4096, fc.BLOCK_BYTES])
def test_gram_cosines_equal_direct_ones(block_bytes):
    v = models(6, seed=2, dtype=np.float32)
    keys = fc.trainable_keys(v[0])
    assert keys == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight"]
    g = fc.gram(v, keys, block_bytes=block_bytes)
    x = np.stack([flat(m, keys) for m in v])
    scale = np.max(np.sum(x * x, axis=1))  # float32 products: error relative to the norms
    np.testing.assert_allclose(g.raw, x @ x.T, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(g.shifted, (x - x[0]) @ (x - x[0]).T, rtol=0, atol=1e-6 * scale)
    direct = np.array([[direct_cos(a, b) for b in x] for a in x])
    np.testing.assert_allclose(fc.cosine(g.raw), direct, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(fc.stack(v, keys), x.astype(np.float32))


def test_gram_ranks_nearly_identical_float32_models_like_float64():
    """Close models (cosines within 1e-6 of 1): the shifted products keep the ranking."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal(50_000).astype(np.float32) * 10
    v = [{"w": base + (rng.standard_normal(base.size) * 1e-3 * (1 + i)).astype(np.float32)}
         for i in range(8)]
    x = np.stack([m["w"].astype(np.float64) for m in v])
    nx = np.linalg.norm(x, axis=1)
    direct = 1 - (x @ x.T) / np.outer(nx, nx)  # 1 - cos, from float64 products
    d = np.linalg.norm(x[:, None] - x[None], axis=2) ** 2  # float64 distances
    got = 1 - fc.cosine(fc.gram(v, ["w"], block_bytes=1 << 14).raw)
    off = ~np.eye(8, dtype=bool)
    assert np.max(direct[off]) < 1e-6
    np.testing.assert_allclose(got[off], direct[off], rtol=1e-3)
    sh = fc.gram(v, ["w"]).shifted
    np.testing.assert_allclose(np.diag(sh)[:, None] + np.diag(sh)[None] - 2 * sh, d, rtol=1e-4,
                               atol=1e-9)


def code_layer_pair_sim(a: Params, b: Params) -> float:
    """The authors' sim() for one pair of models, written as a direct loop."""
    s, sub_a, sub_b = 0.0, None, None
    for cnt, key in enumerate(a):
        x, y = np.ravel(a[key]).astype(np.float64), np.ravel(b[key]).astype(np.float64)
        if cnt % 2 == 0:
            sub_a, sub_b = x, y
        else:
            sub_a, sub_b = np.concatenate([sub_a, x]), np.concatenate([sub_b, y])
            s += direct_cos(sub_a, sub_b)
    return s + direct_cos(sub_a, sub_b)


@pytest.mark.parametrize("drop", [None, "fc.weight"])  # 8 entries (last pair twice), 7 (single)
def test_layer_pair_similarity_equals_the_code_loop(drop):
    v = [{k: x for k, x in m.items() if k != drop} for m in models(5, seed=9, dtype=np.float32)]
    sim, g = fc.similarity(v, "layer-pairs")
    for i in range(5):
        for j in range(5):
            if i != j:
                assert sim[i, j] == pytest.approx(code_layer_pair_sim(v[i], v[j]), rel=1e-6)
    flat_g = fc.similarity(v, "flat")[1]
    np.testing.assert_allclose(g.shifted, flat_g.shifted, rtol=1e-6, atol=1e-6)
    groups = fc.layer_pair_groups(list(v[0]))
    assert groups[-1][1] == (2.0 if drop is None else 1.0)


def test_spread_from_the_gram_matches_direct_distances():
    v = models(5, seed=12)
    g = fc.gram(v)
    a = fc.cross_matrix(fc.select_collaborators(fc.cosine(g.raw), "lowest", 1), 0.7)
    mixed = fc.mix(v, a)
    keys = fc.trainable_keys(v[0])
    y = np.stack([flat(m, keys) for m in mixed])
    want = np.linalg.norm(y - y.mean(axis=0), axis=1)
    np.testing.assert_allclose(fc.spread(g.shifted, a), want, rtol=1e-9)


# ---------------------------------------------------------------------- strategy (mock grid)

NODES = {101: 0, 205: 1, 333: 2, 478: 3, 512: 4}  # node id -> partition id


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "strategy": "fedcross", "num-clients": 5,
            "clients-per-round": 3, "num-server-rounds": 4, "seed": 3, "round-timeout": 2.0,
            "node-wait-timeout": 0.2}
    return build({**base, **kw})


def init_model() -> Params:
    return models(1, seed=99, dtype=np.float32)[0]


def configured(s: FedCrossStrategy, grid: Any, rnd: int) -> list[Message]:
    """Round ``rnd``'s train messages, configure_train given the strategy's own model (as
    Flower's loop gives it the last round's result; another model would restart the slots)."""
    own = s.params if s.params is not None else init_model()
    msgs = list(s.configure_train(rnd, protocol.to_record(own), ConfigRecord(), grid))
    grid.push_messages(msgs)  # message ids, as the runtime gives them
    grid.outbox.clear()
    return msgs


def trained(msg: Message, nodes: dict[int, int] = NODES) -> Params:
    """What a client returns: the received model moved by a partition-dependent step."""
    p = protocol.from_record(msg.content["arrays"])
    rng = np.random.default_rng(nodes[msg.metadata.dst_node_id] + 1000 * int(msg.content["config"]["server-round"]))
    return {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1 if v.dtype.kind == "f" else v + 1)
            for k, v in p.items()}


def reply(msg: Message, params: Params | None = None, nodes: dict[int, int] = NODES) -> Message:
    pid = nodes[msg.metadata.dst_node_id]
    content = RecordDict({"arrays": protocol.to_record(params if params is not None else trained(msg, nodes)),
                          "metrics": MetricRecord({"partition-id": pid, "num-examples": 10 + pid,
                                                   "train-loss": 0.5})})
    return Message(content, reply_to=msg)


def play(s: FedCrossStrategy, grid: Any, rnd: int, fail: Iterable[int] = (),
         metrics: dict[str, Any] | None = None) -> dict[int, Params]:
    """One round; nodes in ``fail`` answer with an error.  Returns the models sent (the
    round's metrics into ``metrics``)."""
    msgs = configured(s, grid, rnd)
    sent = {m.metadata.dst_node_id: protocol.from_record(m.content["arrays"]) for m in msgs}
    replies = [Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=m)
               if m.metadata.dst_node_id in set(fail) else reply(m, nodes=grid.nodes) for m in msgs]
    arrays, record = s.aggregate_train(rnd, replies)
    if metrics is not None:
        metrics.clear()
        metrics.update(record or {})
    if arrays is not None:
        s.params = protocol.from_record(arrays)
    return sent


def slot_sums(s: FedCrossStrategy) -> list[str]:
    return [checksum(x) for x in s.slots]


def assert_global_is_slot_mean(s: FedCrossStrategy) -> None:
    mean = fc.uniform_mean(s.slots)
    assert s.params is not None
    assert checksum(s.params) == checksum(mean)


def test_fedcross_needs_two_slots():
    with pytest.raises(ConfigError, match="'clients-per-round' >= 2"):
        FedCrossStrategy.from_config(cfg(**{"clients-per-round": 1}))


def test_slot_assignment_is_a_seeded_permutation_onto_the_sampled_nodes(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    seen = set()
    for rnd in range(1, 6):
        msgs = configured(s, reply_grid(NODES), rnd)
        assert len(msgs) == 3 and sorted(s.assignment.values()) == [0, 1, 2]
        assert set(s.assignment) == {m.metadata.dst_node_id for m in msgs}
        by_pid = {NODES[n]: slot for n, slot in s.assignment.items()}
        seen.add(tuple(sorted(by_pid.items())))
        # same seed and round, other node ids: the same partitions get the same slots
        t = FedCrossStrategy.from_config(cfg())
        renamed = {n + 7000: p for n, p in NODES.items()}
        configured(t, reply_grid(renamed), rnd)
        assert {renamed[n]: slot for n, slot in t.assignment.items()} == by_pid
    assert len(seen) > 1  # the assignment changes between rounds
    draws = set()
    for seed in range(8):  # the seed matters
        other = FedCrossStrategy.from_config(cfg(seed=seed))
        configured(other, reply_grid(NODES), 1)
        draws.add(tuple(sorted((NODES[n], x) for n, x in other.assignment.items())))
    assert len(draws) > 1


def test_each_node_is_sent_exactly_its_slot_model(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    grid = reply_grid(NODES)
    play(s, grid, 1)
    assert len(set(slot_sums(s))) == 3  # slots differ after one round
    for rnd in (2, 3):
        before = [copy(x) for x in s.slots]
        sent = play(s, grid, rnd)
        for node, params in sent.items():
            assert checksum(params) == checksum(before[s.assignment[node]])


def test_a_failed_node_keeps_its_slot_bit_for_bit(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    grid = reply_grid(NODES)
    play(s, grid, 1)
    msgs = configured(s, grid, 2)
    bad = msgs[0].metadata.dst_node_id
    bad_slot = s.assignment[bad]
    before = slot_sums(s)
    replies = [Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=msgs[0])]
    replies += [reply(m) for m in msgs[1:]]
    arrays, metrics = s.aggregate_train(2, replies)
    after = slot_sums(s)
    assert after[bad_slot] == before[bad_slot]
    assert all(after[i] != before[i] for i in range(3) if i != bad_slot)
    assert metrics["clients-ok"] == 2 and metrics["fedcross-uploads"] == 2
    assert s.last_updated_slots == sorted(set(range(3)) - {bad_slot})
    s.params = protocol.from_record(arrays)
    assert_global_is_slot_mean(s)


def test_a_malformed_upload_is_not_mixed_in(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    grid = reply_grid(NODES)
    msgs = configured(s, grid, 1)
    before = slot_sums(s)
    nan = trained(msgs[1])
    nan["fc.weight"][0, 0] = np.nan
    _, metrics = s.aggregate_train(1, [reply(msgs[0]), reply(msgs[1], nan), reply(msgs[2])])
    bad_slot = s.assignment[msgs[1].metadata.dst_node_id]
    assert metrics["clients-rejected"] == 1 and "NaN" in s.verdict.refused[0].reason
    assert [a == b for a, b in zip(slot_sums(s), before, strict=True)] == [
        i == bad_slot for i in range(3)]


def test_fewer_nodes_than_slots_loses_and_duplicates_nothing(reply_grid):
    s = FedCrossStrategy.from_config(cfg(**{"clients-per-round": 4}))
    few = {101: 0, 205: 1}
    grid = reply_grid(few)
    play(s, reply_grid(NODES), 1)
    for rnd in (2, 3, 4):
        before = slot_sums(s)
        msgs = configured(s, grid, rnd)
        assert len(msgs) == 2 and len(set(s.assignment.values())) == 2
        used = set(s.assignment.values())
        s.aggregate_train(rnd, [reply(m, nodes=few) for m in msgs])
        after = slot_sums(s)
        assert len(s.slots) == 4
        assert len({id(x) for x in s.slots}) == 4
        assert len({id(x["fc.weight"]) for x in s.slots}) == 4
        assert all(after[i] == before[i] for i in range(4) if i not in used)
        assert all(after[i] != before[i] for i in used)


def test_one_upload_is_stored_as_it_is(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES), 1)
    up = trained(msgs[2])
    fails = [Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "x"), reply_to=m) for m in msgs[:2]]
    _, metrics = s.aggregate_train(1, [*fails, reply(msgs[2], up)])
    assert checksum(s.slots[s.assignment[msgs[2].metadata.dst_node_id]]) == checksum(up)
    assert metrics["fedcross-phase"] == 3.0


def test_global_is_the_uniform_mean_of_the_slots_and_metrics_are_reported(reply_grid):
    s = FedCrossStrategy.from_config(cfg(**{"fedcross.alpha": 0.9}))
    grid = reply_grid(NODES)
    m: dict[str, Any] = {}
    for rnd in (1, 2):
        play(s, grid, rnd, metrics=m)
        assert_global_is_slot_mean(s)
    assert m["fedcross-alpha"] == pytest.approx(0.9) and m["fedcross-uploads"] == 3
    assert m["fedcross-phase"] == 0.0
    assert -1 <= m["fedcross-collab-sim"] <= m["fedcross-mean-sim"] <= 1  # lowest similarity
    keys = fc.trainable_keys(s.slots[0])
    x = np.stack([flat(sl, keys) for sl in s.slots])
    assert m["fedcross-slot-spread"] == pytest.approx(np.linalg.norm(x - x.mean(0), axis=1).mean(), rel=1e-5)
    assert m["fedcross-upload-spread"] > m["fedcross-slot-spread"]  # mixing pulls the models together


def test_warmup_resets_every_slot_to_the_uploads_mean(reply_grid):
    s = FedCrossStrategy.from_config(cfg(**{"clients-per-round": 4, "fedcross.warmup": 2}))
    grid = reply_grid({101: 0, 205: 1, 333: 2})  # 3 nodes, 4 slots: one slot gets nothing
    msgs = configured(s, grid, 1)
    ups = {m.metadata.dst_node_id: trained(m, grid.nodes) for m in msgs}
    _, metrics = s.aggregate_train(1, [reply(m, ups[m.metadata.dst_node_id], grid.nodes) for m in msgs])
    mean = fc.uniform_mean(list(ups.values()))
    assert all(checksum(x) == checksum(mean) for x in s.slots)
    assert s.last_updated_slots == [0, 1, 2, 3]
    assert metrics["fedcross-phase"] == 1.0 and metrics["fedcross-slot-spread"] == 0.0
    play(s, grid, 2)
    assert len(set(slot_sums(s))) == 1  # still identical
    play(s, grid, 3)  # vanilla from round 3 (r = 2)
    assert len(set(slot_sums(s))) == 4  # three mixed, one untouched copy of the old mean


def test_propeller_and_dynamic_alpha_phases(reply_grid):
    s = FedCrossStrategy.from_config(cfg(**{"clients-per-round": 4, "fedcross.propeller-rounds": 2,
                                "fedcross.propellers": 2, "fedcross.dynamic-alpha-rounds": 4,
                                "fedcross.alpha": 0.9}))
    grid = reply_grid(NODES)
    got, m = [], {}
    for rnd in range(1, 8):
        play(s, grid, rnd, metrics=m)
        got.append((m["fedcross-phase"], m["fedcross-alpha"]))
    assert [p for p, _ in got] == [2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [a for _, a in got] == pytest.approx([1 / 3, 1 / 3, 0.5, 0.6, 0.7, 0.8, 0.9])


def test_state_dict_round_trip_continues_identically(reply_grid):
    s = FedCrossStrategy.from_config(cfg())
    grid = reply_grid(NODES)
    for rnd in (1, 2):
        play(s, grid, rnd)
    s.round = 2
    t = FedCrossStrategy.from_config(cfg())
    t.load_state_dict(s.state_dict())
    assert slot_sums(t) == slot_sums(s) and t.round == 2
    assert all(a is not b for a, b in zip(t.slots, s.slots, strict=True))
    for rnd in (3, 4):
        play(s, grid, rnd)
        play(t, reply_grid({n + 50: p for n, p in NODES.items()}), rnd)  # new node ids after restart
        assert slot_sums(t) == slot_sums(s)
        assert checksum(t.params) == checksum(s.params)
    with pytest.raises(ValueError, match="slots"):
        FedCrossStrategy.from_config(cfg(**{"clients-per-round": 4})).load_state_dict(s.state_dict())


def test_ima_over_fedcross_averages_each_slot(reply_grid):
    from fedsys_launch.config_schema import make_strategy

    s = make_strategy(cfg(**{"strategy": "ima", "ima.base": "fedcross", "ima.start-round": 1,
                              "ima.window": 2}))
    grid = reply_grid(NODES)
    for rnd in (1, 2, 3):
        play(s, grid, rnd)
    assert s.wrappers[0].round_metrics()["ima-active"] == 1.0
    mean = fc.uniform_mean(s.slots)  # IMA averages the (window-averaged) slots itself
    for key, val in mean.items():
        np.testing.assert_allclose(s.params[key], val, rtol=1e-6, atol=1e-7)


def test_reply_arrays_are_decoded_copies(reply_grid):
    """The mixing writes into the slot arrays: the messages sent must not share them."""
    s = FedCrossStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES), 1)
    sent = [protocol.from_record(m.content["arrays"]) for m in msgs]
    assert not any(np.shares_memory(p["fc.weight"], x["fc.weight"]) for p in sent for x in s.slots)
    assert isinstance(msgs[0].content["arrays"], ArrayRecord)
