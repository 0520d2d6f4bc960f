"""FedELMY (spec ``fedelmy.md``): golden tests of Eqs. 5-9 and the code form's closed-form
gradient, the pool trainer's invariants (§6.21), and the chain's order, warm-up,
retries, skips and traffic with mock replies in Flower's style (``reply_grid``)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import numpy as np
import pytest
import torch
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

from clients import TRAINERS, LocalConfig, TrainJob
from clients.fedelmy import FedElmyTrainer, FedSeqTrainer, split_validation, train_one
from fedsys import fedelmy as fe
from fedsys import pool as pool_ops
from fedsys import protocol
from fedsys.chain import chain_order, p2p_model_transfers, parse_order_list, relay_model_messages
from fedsys.options import ConfigError, parse_group
from fedsys.params import RunningMean, from_torch, mean
from strategies.fedelmy import (
    ChainBrokenError,
    FedElmyStrategy,
    FedSeqStrategy,
    OneShotFedAvgStrategy,
    ParallelFedElmyStrategy,
)

# ---------------------------------------------------------------- maths


@pytest.mark.parametrize(("loss", "d", "s"), [
    (6.02, 45.0, 100.0), (2.3, 1234.0, 1e4), (0.05, 3.0, 1000.0),   # spec §2.2's checks
    (2.3, 0.05, 1.0),                                               # already a decade below
    (0.0, 3.0, 1.0), (2.3, 0.0, 1.0), (float("nan"), 3.0, 1.0),    # §6.3: no crash
])
def test_magnitude_scale_matches_the_official_rule(loss, d, s):
    assert fe.magnitude_scale(loss, d) == s


def test_the_scaled_distance_lands_one_decade_below_the_loss():
    rng = np.random.default_rng(0)
    for _ in range(200):
        loss, d = 10 ** rng.uniform(-2, 1), 10 ** rng.uniform(-1, 4)
        scaled = d / fe.magnitude_scale(loss, d)
        o_l = math.floor(math.log10(loss))
        if d >= 10 ** (o_l - 1):
            assert 10 ** (o_l - 1) <= scaled * (1 + 1e-12) and scaled < 10 ** o_l
        else:
            assert scaled == d


def _vecs(n: int, dim: int = 7, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(n)]


def test_paper_distances_are_eq7_and_eq8():
    theta, m0, m1, m2 = _vecs(4)
    d1, d2 = pool_ops.distances(theta, [m0, m1, m2], m0)
    want = (torch.dist(theta, m0) + torch.dist(theta, m1) + torch.dist(theta, m2)) / 3
    assert torch.allclose(d1, want) and torch.allclose(d2, torch.dist(theta, m0))


def test_paper_form_gradient_is_finite_at_zero_distance():
    # first step of m_1: theta == m_0 exactly (spec §6.4)
    m0 = _vecs(1)[0]
    theta = m0.clone().requires_grad_(True)
    d1, d2 = pool_ops.distances(theta, [m0], m0)
    fe.objective(torch.tensor(0.0, dtype=torch.float64), d1, d2, 0.06, 1.0).backward()
    assert theta.grad is not None and torch.isfinite(theta.grad).all()
    assert torch.count_nonzero(theta.grad) == 0
    g, d1, d2 = pool_ops.distance_gradient(m0.clone(), [m0], m0, 0.06, 1.0)
    assert torch.count_nonzero(g) == 0 and d1 == d2 == 0.0


@pytest.mark.parametrize("form", ["paper", "code"])
def test_each_regulariser_gradient_matches_finite_differences(form):
    theta0, m0, m1, m2 = _vecs(4, dim=5, seed=1)
    pool = [m0, m1, m2]
    start = torch.stack(pool).mean(0)
    alpha, beta, s = 0.3, 1.1, 10.0

    def f(t: torch.Tensor) -> torch.Tensor:
        if form == "paper":
            d1, d2 = pool_ops.distances(t, pool, m0)
        else:
            d1, d2 = fe.code_distances(t, [*pool, start], m0)
        return fe.objective(torch.zeros((), dtype=torch.float64), d1, d2, alpha, beta, s)

    t = theta0.clone().requires_grad_(True)
    f(t).backward()
    assert t.grad is not None
    eps = 1e-6
    fd = torch.stack([(f(theta0 + eps * e) - f(theta0 - eps * e)) / (2 * eps)
                      for e in torch.eye(len(theta0), dtype=torch.float64)])
    assert torch.allclose(t.grad, fd, atol=1e-7)
    if form == "code":  # the closed form (§2.2) equals autograd of the extra-anchor form
        assert torch.allclose(fe.code_gradient(theta0, m0, start, alpha, beta, s), t.grad)
    else:  # the in-place closed form the trainer uses equals autograd of Eqs. 7-9
        g, d1, d2 = pool_ops.distance_gradient(theta0, pool, m0, alpha, beta, s)
        assert torch.allclose(g, t.grad)
        want1, want2 = pool_ops.distances(theta0, pool, m0)
        assert math.isclose(d1, float(want1)) and math.isclose(d2, float(want2))


def test_code_form_with_equal_weights_leaves_the_first_pool_model_unregularised():
    theta, m0 = _vecs(2)
    g = fe.code_gradient(theta, m0, m0, 0.5, 0.5)  # j = 1: start = m_0
    assert torch.count_nonzero(g) == 0


def test_code_form_and_paper_form_differ_from_the_second_pool_model_on():
    theta, m0, m1 = _vecs(3, seed=2)
    start = (m0 + m1) / 2
    t = theta.clone().requires_grad_(True)
    d1, d2 = pool_ops.distances(t, [m0, m1], m0)
    fe.objective(torch.zeros((), dtype=torch.float64), d1, d2, 0.5, 1.0).backward()
    assert t.grad is not None
    code = fe.code_gradient(theta, m0, start, 0.5, 1.0)
    cos = float(torch.nn.functional.cosine_similarity(t.grad, code, dim=0))
    assert not torch.allclose(t.grad, code) and cos < 0.999


def test_add_to_grads_splits_a_flat_vector_over_the_parameters():
    a, b = torch.zeros(2, 3, requires_grad=True), torch.zeros(4, requires_grad=True)
    b.grad = torch.ones(4)
    pool_ops.add_to_grads([a, b], torch.arange(10.0))
    assert a.grad is not None and torch.equal(a.grad, torch.arange(6.0).view(2, 3))
    assert torch.equal(b.grad, 1 + torch.arange(6.0, 10.0))


def test_running_mean_is_the_uniform_mean_bit_for_bit():
    rng = np.random.default_rng(1)
    models = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "z": -np.zeros(2, np.float32),
               "n": np.array(int(rng.integers(0, 9)), np.int64)} for _ in range(6)]
    run = RunningMean()
    for k, m in enumerate(models, 1):
        run.add(m)
        got, want = run.mean(), mean(models[:k])
        assert all(got[n].dtype == want[n].dtype and got[n].tobytes() == want[n].tobytes()
                   for n in want)


# ---------------------------------------------------------------- chain order


def test_chain_orders():
    pids = [4, 0, 2, 1]
    assert chain_order(pids, "index", 7) == [0, 1, 2, 4]
    a = chain_order(pids, "permutation", 7, pass_index=0)
    assert sorted(a) == [0, 1, 2, 4]
    assert chain_order(pids, "permutation", 7, pass_index=3) == a  # same order every pass
    assert chain_order(pids, "permutation", 7, 0) == a              # reproducible from the seed
    orders = {tuple(chain_order(pids, "permutation", s)) for s in range(20)}
    assert len(orders) > 5                                          # the seed matters
    re = [chain_order(pids, "permutation", 7, p, reshuffle=True) for p in range(6)]
    assert len({tuple(o) for o in re}) > 1
    assert chain_order(pids, "list", 7, given=[2, 4, 0]) == [2, 4, 0]
    with pytest.raises(ValueError, match=r"\[9\]"):
        chain_order(pids, "list", 7, given=[9, 0])
    assert parse_order_list(" 3, 1,2 ") == [3, 1, 2]
    for bad in ["", "1,1", "a,b", "-1"]:
        with pytest.raises(ValueError):
            parse_order_list(bad)


def test_traffic_counts_of_the_spec():
    assert relay_model_messages(10) == 20        # 2N through a Flower relay (§3)
    assert p2p_model_transfers(10) == 9          # N - 1 peer to peer (§4.3.1)
    assert p2p_model_transfers(4, passes=3) == 11


# ---------------------------------------------------------------- the pool trainer


def _job(trainer: Any, seed: int = 3, **opts: Any) -> TrainJob:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.BatchNorm1d(8),
                              torch.nn.ReLU(), torch.nn.Linear(8, 3))
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 255, (98, 1, 3, 4), generator=g, dtype=torch.uint8)
    y = (x.float().mean((1, 2, 3)) > 127).long() + (x[:, 0, 0, 0] > 200).long()
    options = parse_group(trainer.Options, trainer.prefix(),
                          {f"{trainer.prefix()}.{k.replace('_', '-')}": v for k, v in opts.items()})
    return TrainJob(net, x, y, lambda b: b.float() / 255, LocalConfig(
        epochs=2, batch_size=16, lr=1e-2, weight_decay=1e-4, seed=seed), options,
        run_seed=11, partition_id=2)


def _state(net: torch.nn.Module) -> dict[str, np.ndarray]:
    return from_torch(net.state_dict())


def test_with_no_regularisers_the_reply_is_the_mean_of_a_pool_grown_by_eq6():
    """m_1 starts at m_0; m_j at the mean of the first j pool models; the reply is the
    mean of all S + 1, m_0 included (Eqs. 5, 6; spec §6.21)."""
    job = _job(FedElmyTrainer, pool_size=2, alpha=0.0, beta=0.0)
    m0 = _state(job.net)
    FedElmyTrainer().train(job)
    got = _state(job.net)

    ref = _job(FedElmyTrainer, pool_size=2, alpha=0.0, beta=0.0)
    tr, va = split_validation(len(ref.y), 0.1, _derive(11, 2, 0x7A11))
    data = (ref.x[tr], ref.y[tr], ref.x[va], ref.y[va])
    pool = [m0]
    for j in (1, 2):
        ref.net.load_state_dict({k: torch.from_numpy(v) for k, v in mean(pool).items()})
        fit = train_one(ref.net, ref, data, 2, _derive(3, j), True)
        pool.append(fit.state)
    want = mean(pool)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)
    assert "num_batches_tracked" in "".join(want)  # BatchNorm buffers are averaged too


def _derive(*xs: int) -> int:
    from fedsys.seeding import derive_seed
    return derive_seed(*xs)


def test_validation_split_is_seeded_disjoint_and_the_same_every_hop():
    tr, va = split_validation(100, 0.1, 5)
    assert len(va) == 10 and len(tr) == 90
    assert set(tr.tolist()).isdisjoint(va.tolist()) and sorted([*tr.tolist(), *va.tolist()]) == list(range(100))
    _, va2 = split_validation(100, 0.1, 5)
    assert torch.equal(va, va2) and not torch.equal(va, split_validation(100, 0.1, 6)[1])
    assert len(split_validation(5, 0.1, 1)[1]) == 1       # never an empty split when asked
    assert len(split_validation(5, 0.0, 1)[1]) == 0


@pytest.mark.parametrize("form", ["paper", "code"])
def test_the_pool_trainer_is_deterministic_and_reports_its_pool(form):
    a, b = _job(FedElmyTrainer, pool_size=3, form=form), _job(FedElmyTrainer, pool_size=3, form=form)
    ra, rb = FedElmyTrainer().train(a), FedElmyTrainer().train(b)
    assert ra.metrics == rb.metrics and ra.metrics["pool-size"] == 4
    sa, sb = _state(a.net), _state(b.net)
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert ra.num_examples == 89  # the 90 % train split of 98
    assert ra.metrics["trained-examples"] == 3 * 2 * 89


def test_paper_and_code_forms_train_different_pools():
    a, b = _job(FedElmyTrainer, form="paper", alpha=0.5), _job(FedElmyTrainer, form="code", alpha=0.5)
    FedElmyTrainer().train(a)
    FedElmyTrainer().train(b)
    sa, sb = _state(a.net), _state(b.net)
    assert not all(np.allclose(sa[k], sb[k]) for k in sa if sa[k].dtype.kind == "f")


def test_fedseq_sends_its_best_validation_epoch_and_warms_up_when_asked():
    job = _job(FedSeqTrainer)
    res = FedSeqTrainer().train(job)
    assert res.metrics["trained-examples"] == 2 * 89 and "pool-size" not in res.metrics
    warm = _job(FedSeqTrainer)
    warm = TrainJob(warm.net, warm.x, warm.y, warm.normalise,
                    LocalConfig(**{**warm.config.__dict__, "warmup_epochs": 3}), warm.options,
                    run_seed=11, partition_id=2)
    assert FedSeqTrainer().train(warm).metrics["trained-examples"] == 5 * 89


def test_trainers_are_registered():
    assert TRAINERS["fedelmy"] is FedElmyTrainer and TRAINERS["fedseq"] is FedSeqTrainer


# ---------------------------------------------------------------- the chain (mock grid)

NODES = {101: 0, 205: 1, 333: 2, 478: 3}


def _model(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32), "n": np.array(1, np.int64)}


class Chain:
    """Answers like ClientApps: query -> partition id; train -> the received model + 1
    (+ 100 when a warm-up was asked); ``fail`` maps partition ids to how many train
    instructions they answer with an error first."""

    def __init__(self, fail: dict[int, int] | None = None,
                 held: frozenset[int] = frozenset()) -> None:
        self.fail = dict(fail or {})
        self.held = held  # partition ids whose replies say their pool was held
        self.visits: list[tuple[int, dict[str, Any]]] = []

    def __call__(self, m: Message) -> Message:
        pid = NODES[m.metadata.dst_node_id]
        if m.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=m)
        cfg = dict(m.content["config"])
        self.visits.append((pid, cfg))
        if self.fail.get(pid, 0) > 0:
            self.fail[pid] -= 1
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=m)
        got = protocol.from_record(m.content["arrays"])
        new = {"w": got["w"] + 1 + 100 * (cfg.get("warmup-epochs", 0) > 0), "n": got["n"]}
        content = RecordDict({"arrays": ArrayRecord({k: protocol.Array(v) for k, v in new.items()}),
                              "metrics": MetricRecord({"partition-id": pid, "num-examples": 10 * (pid + 1),
                                                       "train-loss": 0.1, **({
                                                           fe.POOL_HELD: 1.0, fe.GRAD_RATIO: 2.5}
                                                           if pid in self.held else {})})})
        return Message(content, reply_to=m)


def _run(strategy: Any, grid: Any, stop_after: int = 0) -> Any:
    """Run ``strategy``: its result and records (``stop_after``: interrupted after that round)."""
    strategy.poll_interval = 0.0
    strategy.settings = dataclasses.replace(strategy.settings, fraction_evaluate=0.0)
    records: list[dict[str, Any]] = []

    def record(s: Any, r: dict[str, Any]) -> None:
        records.append(r)
        if r["round"] == stop_after:
            raise KeyboardInterrupt

    res = strategy.start(grid, protocol.to_record(_model(0.0)), timeout=2.0,
                         train_config=ConfigRecord({"lr": 0.1}), on_round=[record])
    return res, records


def test_one_shot_chain_visits_every_client_once_warms_up_first_and_keeps_every_hop(reply_grid):
    chain = Chain()
    s = FedElmyStrategy(order="permutation", seed=4, warmup_epochs=2, num_partitions=4,
                        query_partitions=True)  # the order is over partition-ids
    res, recs = _run(s, reply_grid(NODES, answer=chain))
    order = chain_order([0, 1, 2, 3], "permutation", 4)
    assert [pid for pid, _ in chain.visits] == order
    assert [r["client"] for r in recs] == order and [r["hop"] for r in recs] == [1, 2, 3, 4]
    assert [c.get("warmup-epochs", 0) for _, c in chain.visits] == [2, 0, 0, 0]
    assert [c["trainer"] for _, c in chain.visits] == ["fedelmy"] * 4
    assert protocol.from_record(res.arrays)["w"][0, 0] == 104.0  # 100 (warm-up) + 4 hops
    # relay traffic: one model down and one up per hop, serialised bytes counted
    last = recs[-1]
    size = protocol.model_bytes(Message(RecordDict({"arrays": protocol.to_record(_model(0))}),
                                        dst_node_id=1, message_type=MessageType.TRAIN))[1]
    assert last["models-down"] + last["models-up"] == relay_model_messages(4)
    assert last["bytes-down"] == last["bytes-up"] == 4 * size


def test_few_shot_ring_keeps_the_order_unless_reshuffled(reply_grid):
    chain = Chain()
    s = FedSeqStrategy(order="permutation", seed=1, passes=3, num_partitions=4)
    _, recs = _run(s, reply_grid(NODES, answer=chain))
    visits = [pid for pid, _ in chain.visits]
    assert len(visits) == 12 and visits[:4] == visits[4:8] == visits[8:]
    assert [r["pass"] for r in recs] == [1] * 4 + [2] * 4 + [3] * 4
    assert [c["trainer"] for _, c in chain.visits] == ["fedseq"] * 12
    chain2 = Chain()
    _run(FedSeqStrategy(order="permutation", seed=1, passes=3, reshuffle=True, num_partitions=4),
         reply_grid(NODES, answer=chain2))
    passes = [tuple(pid for pid, _ in chain2.visits[4 * p: 4 * p + 4]) for p in range(3)]
    assert passes == [tuple(chain_order([0, 1, 2, 3], "permutation", 1, p, True)) for p in range(3)]


def test_a_failed_hop_is_retried_once_then_skipped_and_the_chain_goes_on(reply_grid):
    chain = Chain(fail={1: 1, 2: 5})  # client 1 fails once, client 2 always
    s = FedElmyStrategy(warmup_epochs=0, num_partitions=4, query_partitions=True)
    res, recs = _run(s, reply_grid(NODES, answer=chain))
    assert [pid for pid, _ in chain.visits] == [0, 1, 1, 2, 2, 3]
    by = {r["client"]: r for r in recs}
    assert by[1]["hop-tries"] == 2 and by[1]["hop-skipped"] == 0
    assert by[2]["hop-tries"] == 2 and by[2]["hop-skipped"] == 1 and by[2]["clients-ok"] == 0
    # client 3 got the last good model (client 1's): 3 good hops in all
    assert protocol.from_record(res.arrays)["w"][0, 0] == 3.0


def test_the_warm_up_moves_on_when_the_first_client_fails(reply_grid):
    chain = Chain(fail={0: 9})
    _run(FedElmyStrategy(warmup_epochs=2, num_partitions=4), reply_grid(NODES, answer=chain))
    assert [(pid, c.get("warmup-epochs", 0)) for pid, c in chain.visits] == [
        (0, 2), (0, 2), (1, 2), (2, 0), (3, 0)]


def test_too_many_skipped_hops_stop_the_run_with_a_reason(reply_grid):
    chain = Chain(fail={0: 9, 1: 9, 2: 9})
    s = FedElmyStrategy(warmup_epochs=0, num_partitions=4, max_skipped=0.5)
    with pytest.raises(ChainBrokenError, match="3 of 4 steps skipped"):
        _run(s, reply_grid(NODES, answer=chain))


def test_a_chain_resumed_from_its_state_continues_at_the_next_hop(reply_grid):
    full_chain = Chain()
    _, full = _run(FedElmyStrategy(order="permutation", seed=2, passes=2, num_partitions=4),
                   reply_grid(NODES, answer=full_chain))
    first = FedElmyStrategy(order="permutation", seed=2, passes=2, num_partitions=4)
    first_chain = Chain()
    with pytest.raises(KeyboardInterrupt):
        _run(first, reply_grid(NODES, answer=first_chain), stop_after=5)
    state = first.state_dict()
    again = FedElmyStrategy(order="permutation", seed=2, passes=2, num_partitions=4)
    again.load_state_dict(state)
    rest_chain = Chain()
    res, rest = _run(again, reply_grid(NODES, answer=rest_chain))
    assert [pid for pid, _ in first_chain.visits + rest_chain.visits] == [p for p, _ in full_chain.visits]
    assert [r["round"] for r in rest] == [6, 7, 8]
    assert [c.get("warmup-epochs", 0) for _, c in rest_chain.visits] == [0, 0, 0]
    assert protocol.from_record(res.arrays)["w"][0, 0] == 108.0
    assert [r["client"] for r in rest] == [r["client"] for r in full[-3:]]


def test_parallel_baselines(reply_grid):
    chain = Chain()
    res, recs = _run(OneShotFedAvgStrategy(warmup_epochs=1, num_partitions=4),
                     reply_grid(NODES, answer=chain))
    assert [pid for pid, _ in chain.visits[:1]] == [0] and chain.visits[0][1]["local-epochs"] == 0
    assert sorted(pid for pid, _ in chain.visits[1:]) == [0, 1, 2, 3]
    assert protocol.from_record(res.arrays)["w"][0, 0] == 102.0  # warm start + 1, averaged
    assert [r["round"] for r in recs] == [1, 2]
    chain = Chain()
    res, _ = _run(ParallelFedElmyStrategy(warmup_epochs=1, num_partitions=4, seed=3),
                  reply_grid(NODES, answer=chain))
    seeds = {c["init-seed"] for _, c in chain.visits}
    assert len(chain.visits) == 4 and len(seeds) == 4  # each client its own start (Alg. 3)
    assert all(c["warmup-epochs"] == 1 for _, c in chain.visits)
    assert protocol.from_record(res.arrays)["w"][0, 0] == 101.0


def test_a_parallel_step_and_a_hop_report_as_a_fedavg_round(reply_grid, caplog):
    """The chain's steps reuse the engine's parts: a parallel step that made no model logs the
    engine's line (counts and reasons); its loss mean, a hop's bookkeeping and, with
    Flower's train_metrics_aggr_fn, a hop's client metrics are :mod:`strategies.client_metrics`'s."""
    from strategies.client_metrics import train_metrics

    chain = Chain(fail={p: 1 for p in range(4)})
    s = ParallelFedElmyStrategy(warmup_epochs=0, num_partitions=4, passes=2)
    with caplog.at_level(logging.ERROR):
        _, recs = _run(s, reply_grid(NODES, answer=chain))
    assert "round 1: no usable update (4 replies refused or missing: 4x " in caplog.text
    assert recs[0]["clients-ok"] == 0 and recs[0]["clients-rejected"] == 4
    ups = s.verdict.updates
    assert len(ups) == 4 and {k: recs[1][k] for k in ("clients-ok", "train-loss")} == {
        k: train_metrics(ups, 0, "train-loss")[k] for k in ("clients-ok", "train-loss")}

    def aggr(contents: list[RecordDict], key: str) -> MetricRecord:
        return MetricRecord({"mine": float(len(contents))})

    hop = FedSeqStrategy(num_partitions=4, warmup_epochs=0, train_metrics_aggr_fn=aggr,
                         train_loss_key="train-loss")
    _, recs = _run(hop, reply_grid(NODES, answer=Chain()))
    assert all(r["mine"] == 1.0 and r["train-loss"] == 0.1 and r["clients-ok"] == 1
               for r in recs), recs


def test_pool_held_is_a_ratio_above_one_with_s_one_throughout():
    """:func:`fedsys.fedelmy.pool_held`: the pull outweighs the loss's gradient while App.
    A's s stayed 1 for every pool model; at the bound, with any s above 1, or with no pool
    model, not held."""
    assert fe.pool_held(2.0, [1.0, 1.0]) and fe.pool_held(1.0001, [1.0])
    assert not fe.pool_held(fe.HELD_RATIO, [1.0])
    assert not fe.pool_held(2.0, [1.0, 10.0]) and not fe.pool_held(759.0, [1e7])
    assert not fe.pool_held(0.5, [1.0]) and not fe.pool_held(2.0, [])


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("strategy", ["chain", "parallel"])
def test_a_held_pool_is_warned_once_in_the_servers_log(reply_grid, caplog, strategy):
    """A reply saying its client's pool was held (``pool-held`` 1) gets one WARNING in the
    server's log naming the client, the ratio and ``fedelmy.beta``, however many replies
    say so; none when no reply does (the operator of a deployment sees no client log)."""
    def run(held: frozenset[int]) -> list[str]:
        caplog.clear()
        s = (FedElmyStrategy(order="index", passes=2, num_partitions=4, query_partitions=True)
             if strategy == "chain" else ParallelFedElmyStrategy(num_partitions=4, passes=2))
        with caplog.at_level(logging.WARNING, logger="flwr"):
            _run(s, reply_grid(NODES, answer=Chain(held=held)))
        return _warnings(caplog)

    assert run(frozenset()) == []
    [one] = run(frozenset({1, 2}))
    assert "client 1's FedELMY pool stayed near the received model" in one, one
    assert "2.5 times the loss's" in one and "fedelmy.beta" in one and fe.POOL_HELD in one


def test_a_wrong_order_list_is_a_config_error():
    with pytest.raises(ConfigError, match=r"chain\.order-list"):
        FedElmyStrategy(order="list", order_list="1,1")
    with pytest.raises(ConfigError, match=r"partitions \[7\] do not exist"):
        FedElmyStrategy(order="list", order_list="0,7", num_partitions=4)
    with pytest.raises(TypeError, match="passes"):
        FedElmyStrategy(passs=3)
