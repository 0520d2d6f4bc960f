"""Issue 42 item 1: the bounds every strategy puts on a reply by default, against the two
finite attacks that got through before (a model x 100; an untrained model claiming 20 x its
samples), on the maths (golden values) and through a strategy's real reply path with
replies built as a ClientApp builds them (``Message(content, reply_to=instruction)``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedsys import protocol
from fedsys.params import distance, mean
from fedsys.validation import (
    capped_claims,
    history_norms,
    norm_refusals,
    ratio_capped_claims,
    share_cap_level,
)
from strategies.fedavg import FedAvgStrategy
from tests.unit.test_base_strategy import NODES, cfg, configured, model, reply


def test_norm_refusals_golden() -> None:
    # three replies: each against the median of the two others
    got = norm_refusals({1: 1.0, 2: 2.0, 3: 100.0}, [], 20)
    assert got.keys() == {3}
    assert got[3] == ("update norm 100, 66.7 times the median 1.5 of the round's other "
                      "replies (max-update-ratio 20)")
    assert norm_refusals({1: 1.0, 2: 2.0, 3: 29.0}, [], 20) == {}        # 19.3 x: kept
    # fewer than three: against the updates accepted before (a chain's earlier hops)
    assert norm_refusals({7: 50.0}, [1.0, 2.0, 3.0], 20) == {7: (
        "update norm 50, 25 times the median 2 of the updates before (max-update-ratio 20)")}
    assert norm_refusals({7: 50.0, 8: 1.0}, [1.0, 2.0, 3.0], 20).keys() == {7}
    assert norm_refusals({7: 50.0}, [], 20) == {}                       # nothing to compare
    assert norm_refusals({1: 1.0, 2: 2.0, 3: 100.0}, [], 0) == {}       # bound off
    assert norm_refusals({1: 0.0, 2: 0.0, 3: 5.0}, [], 20) == {}        # a zero yardstick


def test_capped_claims_golden() -> None:
    # the 20 x claim among three: cut to the others' sum, half of the mean
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 0.5) == {1: 2.0}
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 0.8) == {1: pytest.approx(8.0)}
    assert capped_claims({1: 1.0, 2: 1.0, 3: 1.9}, 0.5) == {}           # 0.49 of the mean
    # two: capped too (issue 65 E; this line read "two: no cap", 20 / 21 of the mean)
    assert capped_claims({1: 20.0, 2: 1.0}, 0.5) == {1: 1.0}
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 0) == {}            # cap off
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 1) == {}
    n = {1: 20.0, 2: 1.0, 3: 1.0}
    cut = {**n, **capped_claims(n, 0.5)}
    assert cut[1] / sum(cut.values()) == pytest.approx(0.5)


def shares(claims: dict[int, float], cap: float) -> dict[int, float]:
    """Each reply's share of the weighted mean after the cut, counted in whole examples
    as :func:`strategies.replies.bound` counts it."""
    cut = {**claims, **{k: math.floor(v) for k, v in capped_claims(claims, cap).items()}}
    return {k: v / sum(cut.values()) for k, v in cut.items()}


@pytest.mark.parametrize(("claims", "cap", "before"), [
    ((100, 100, 1, 1, 1), 0.3, 0.484),     # cut against the others' uncut claims: 44.1 each
    ((50, 50, 1, 1), 0.4, 0.486),
    ((12_000, 600), 0.5, 0.952),           # two replies: no cap
])
def test_the_weight_cap_holds_after_every_cut(claims, cap, before) -> None:
    """Issue 65 E: each cut was computed against the others' uncut claims, so two large
    claims both cut ended above the cap (``before``: the largest share at cea6e3e)."""
    got = shares(dict(enumerate(map(float, claims))), cap)
    assert max(got.values()) <= cap + 1e-12 and max(got.values()) < before - 0.05
    assert share_cap_level([100, 100, 1, 1, 1], 0.3) == pytest.approx(2.25)   # 2.25 / 7.5
    assert share_cap_level([50, 50, 1, 1], 0.4) == pytest.approx(4.0)          # 4 / 10


def test_a_cap_below_one_over_n_counts_every_reply_equally() -> None:
    # no weighting of 3 replies gives each at most 0.2: equal weights, the best there is
    assert capped_claims({1: 5.0, 2: 4.0, 3: 3.0}, 0.2) == {1: 3.0, 2: 3.0}
    assert capped_claims({1: 3.0, 2: 3.0, 3: 3.0}, 0.2) == {}
    assert capped_claims({1: 9.0}, 0.5) == {}                          # one reply: all of it


def test_the_weight_cap_property_over_random_claims_and_caps() -> None:
    """For any cap s in (0, 1) and any claims: after the cut (in whole examples) no reply
    has more than max(s, 1/n) of the sum; only claims above the level are cut, all to it,
    and they stay the largest; a cap below 1/n leaves equal weights; where the cap is
    feasible a cut claim has the share s exactly before the rounding."""
    rng = np.random.default_rng(65)
    for _ in range(3000):
        n = int(rng.integers(1, 13))
        claims = {i: float(c) for i, c in enumerate(rng.integers(1, 10**rng.integers(1, 6), n))}
        if rng.random() < 0.3:                                            # ties
            claims = {i: float(claims[int(rng.integers(0, n))]) for i in range(n)}
        cap = float(rng.uniform(0.01, 0.99)) if rng.random() < 0.9 else float(rng.choice([1 / n, 0.5]))
        cut = capped_claims(claims, cap)
        got = shares(claims, cap)
        assert max(got.values()) <= max(cap, 1 / n) + 1e-9, (claims, cap, cut)
        assert all(claims[k] > v for k, v in cut.items())                 # only cuts
        assert len(set(cut.values())) <= 1                                # to one level
        if cut:
            level = next(iter(cut.values()))
            assert all(v <= level for k, v in claims.items() if k not in cut)
            raw = {**claims, **cut}
            if cap * n > 1:
                assert max(raw.values()) / sum(raw.values()) == pytest.approx(cap)
            else:
                assert len(set(raw.values())) == 1                        # equal weights
        elif cap * n > 1:
            assert max(claims.values()) <= cap * sum(claims.values()) + 1e-9
        else:                                                             # already equal
            assert len(set(claims.values())) == 1


def test_a_round_without_a_yardstick_seeds_the_history_with_its_smallest_norm() -> None:
    """Issue 65 E: a first round of two replies (norms 1 and 1000) met no yardstick, yet
    both entered the history: round 2 then accepted 9000 (median 500.5, 18 x)."""
    assert history_norms({1: 1.0, 2: 1000.0}, {1, 2}, [], 20) == [1.0]
    assert norm_refusals({3: 9000.0}, [1.0], 20).keys() == {3}
    assert norm_refusals({3: 9000.0}, [1.0, 1000.0], 20) == {}          # what the old seed let in
    # measured norms enter, in order: three replies each against the two others ...
    assert history_norms({1: 1.0, 2: 2.0, 3: 100.0}, {1, 2}, [], 20) == [1.0, 2.0]
    # ... or one or two against the history
    assert history_norms({7: 3.0, 8: 40.0}, {7, 8}, [2.0], 20) == [3.0, 40.0]
    assert history_norms({7: 3.0}, {7}, [], 20) == [3.0]               # a chain's first hop
    assert history_norms({7: 3.0}, set(), [], 20) == []
    assert history_norms({1: 0.0, 2: 0.0, 3: 5.0}, {1, 2, 3}, [], 20) == [0.0, 0.0]  # 3: a 0 yardstick


def test_a_first_round_of_two_replies_does_not_open_the_bound_for_the_next(reply_grid) -> None:
    """The same through FedAvg's reply path: norms 1 and 1000 (x c) in round 1; in round 2
    9000 beside an honest 1, each against the history: refused now, accepted before."""
    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 2}))
    grid = reply_grid(NODES)
    s.params = model(1.0)
    m1, m2 = configured(s, grid, 1)
    _, metrics = s.aggregate_train(1, [hostile(m1, model(1.001), 10), hostile(m2, model(2.0), 10)])
    assert metrics is not None and metrics["clients-ok"] == 2
    seed = distance(model(1.001), model(1.0))
    s.params = model(1.0)
    m3, m4 = configured(s, grid, 2)
    _, metrics = s.aggregate_train(2, [hostile(m3, model(10.0), 10), hostile(m4, model(1.001), 10)])
    assert metrics is not None and metrics["clients-rejected"] == 1 and metrics["clients-ok"] == 1
    assert s.update_norms == [pytest.approx(seed), pytest.approx(seed)]


def hostile(msg: Message, params: dict[str, np.ndarray], num_examples: float) -> Message:
    pid = NODES[msg.metadata.dst_node_id]
    content = RecordDict({"arrays": ArrayRecord({k: protocol.Array(v) for k, v in params.items()}),
                          "metrics": MetricRecord({"partition-id": pid, "num-examples": num_examples,
                                                   "train-loss": 0.5})})
    return Message(content, reply_to=msg)


def test_a_model_times_100_is_refused_with_the_numbers_and_the_round_goes_on(reply_grid, caplog):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))   # every node was sent model(1.0)
    honest = [reply(m, model(1.0 + 0.1 * i)) for i, m in enumerate(msgs[1:], start=1)]
    scaled = {k: (v * 100 if np.issubdtype(v.dtype, np.floating) else v)
              for k, v in model(1.0).items()}
    bad = hostile(msgs[0], scaled, 10 * (NODES[msgs[0].metadata.dst_node_id] + 1))
    arrays, metrics = s.aggregate_train(1, [*honest, bad])
    assert metrics is not None and metrics["clients-ok"] == 2 and metrics["clients-rejected"] == 1
    assert "update norm" in caplog.text and "max-update-ratio 20" in caplog.text
    pids = [NODES[m.metadata.dst_node_id] for m in msgs[1:]]
    # the two replies left claim 10 (p + 1) each and are weighted so, as Flower weighs them
    # (issue 77; from issue 65 E to 77 a share cap of 0.5 counted the larger as the smaller)
    want = mean([model(1.0 + 0.1 * i) for i in (1, 2)], [10 * (p + 1) for p in pids])
    got = protocol.from_record(arrays)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_an_untrained_model_claiming_20x_is_counted_as_15x_the_median(reply_grid, caplog):
    """Issue 77: ``max-weight-ratio`` 15 cuts the claim to 15 times the median of the
    others' (1500 of 1700); ``max-weight-share`` 0.5, the default from issue 42 to 77,
    still cuts it to half of the mean where set."""
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    honest = [hostile(m, model(1.1), 100) for m in msgs[1:]]
    fresh = hostile(msgs[0], model(0.9), 20 * 100)   # a fresh model, 20 x the samples
    arrays, metrics = s.aggregate_train(1, [*honest, fresh])
    assert metrics is not None and metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0
    got = protocol.from_record(arrays)
    want = mean([model(0.9), model(1.1), model(1.1)], [1500, 100, 100])
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert ("claims num-examples 2000, more than max-weight-ratio 15 times the median 100 of "
            "the round's other claims: counted as 1500") in caplog.text
    before = mean([model(0.9), model(1.1), model(1.1)], [2000, 100, 100])
    assert abs(float(before["w"][0, 0]) - 0.9) < 0.02    # without a bound: ~91 % its model
    caplog.clear()
    capped = FedAvgStrategy.from_config(cfg(**{"max-weight-share": 0.5, "max-weight-ratio": 0}))
    msgs = configured(capped, reply_grid(NODES))
    arrays, _ = capped.aggregate_train(1, [*[hostile(m, model(1.1), 100) for m in msgs[1:]],
                                           hostile(msgs[0], model(0.9), 2000)])
    got = protocol.from_record(arrays)
    # counted as 200 (the others' sum): exactly half of the mean
    want = mean([model(0.9), model(1.1), model(1.1)], [200, 100, 100])
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert "more than max-weight-share 0.5 of the round's weighted mean: counted as 200" in caplog.text


def test_ratio_capped_claims_golden() -> None:
    """Issue 77: each claim against the median of the round's others, leave-one-out."""
    assert ratio_capped_claims({1: 2000.0, 2: 100.0, 3: 100.0}, 15) == {1: 1500.0}
    assert ratio_capped_claims({1: 50.0, 2: 5.0, 3: 5.0}, 15) == {}     # 10 x: a large site
    assert ratio_capped_claims({1: 30.0, 2: 10.0}, 15) == {}
    assert ratio_capped_claims({1: 400.0, 2: 10.0}, 15) == {1: 150.0}   # two: the other's
    # two large among four: each against the median of its others (10, 10 and the other)
    assert ratio_capped_claims({1: 151.0, 2: 10.0, 3: 10.0, 4: 200.0}, 15) == {1: 150.0, 4: 150.0}
    assert ratio_capped_claims({1: 150.0, 2: 10.0, 3: 10.0}, 15) == {}   # at the bound: kept
    assert ratio_capped_claims({1: 2000.0, 2: 100.0, 3: 100.0}, 0) == {}  # off
    assert ratio_capped_claims({1: 2000.0}, 15) == {}                     # one reply: no median
    # two liars among three cannot be told from the honest one: the median is theirs
    assert ratio_capped_claims({1: 2000.0, 2: 2000.0, 3: 100.0}, 15) == {}


def test_one_reply_a_round_is_bounded_by_the_updates_before_and_the_history_resumes(reply_grid):
    """A chain's hop (or a round of one reply) is measured against the last accepted
    updates; those are part of the strategy's state, so a resumed run bounds the same."""
    s = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 1}))
    grid = reply_grid(NODES)
    for rnd, v in ((1, 1.2), (2, 1.1)):              # honest: sent model(1.0) each time
        (m,) = configured(s, grid, rnd)
        s.params = model(1.0)
        _, metrics = s.aggregate_train(rnd, [hostile(m, model(v), 10)])
        assert metrics is not None and metrics["clients-ok"] == 1
    assert s.update_norms == [pytest.approx(distance(model(v), model(1.0))) for v in (1.2, 1.1)]
    again = FedAvgStrategy.from_config(cfg(**{"clients-per-round": 1}))
    again.load_state_dict(s.state_dict())
    for strat in (s, again):
        (m,) = configured(strat, grid, 3)
        _, metrics = strat.aggregate_train(3, [hostile(m, model(100.0), 10)])
        assert metrics is not None and metrics["clients-rejected"] == 1


def test_the_bounds_are_config_keys_with_their_bounds(reply_grid):
    s = FedAvgStrategy.from_config(cfg(**{"max-update-ratio": 0, "max-weight-share": 0}))
    msgs = configured(s, reply_grid(NODES))
    scaled = {k: v * 100 if np.issubdtype(v.dtype, np.floating) else v for k, v in model(1.0).items()}
    _, metrics = s.aggregate_train(1, [hostile(msgs[0], scaled, 10),
                                       *[hostile(m, model(1.0), 10) for m in msgs[1:]]])
    assert metrics is not None and metrics["clients-ok"] == 3      # both off: accepted
    from fedsys.config import ConfigError
    with pytest.raises(ConfigError, match="max-weight-share"):
        cfg(**{"max-weight-share": 1.5})
    with pytest.raises(ConfigError, match="max-weight-ratio"):
        cfg(**{"max-weight-ratio": -1})


ROUND_BASED = ["fedavg", "fedprox", "fedadam", "fedavgm", "fedyogi", "fedcda", "fedcross", "ima", "robust",
               "dp"]


@pytest.mark.parametrize("strategy", ROUND_BASED)
@pytest.mark.parametrize("attack", ["scaled", "sign-flipped", "inflated-count"])
def test_the_finite_attacks_under_every_round_based_strategy(strategy, attack, reply_grid, caplog):
    """The fuzz suite's finite attacks (issue 42 item 5) through each strategy's reply path:
    a model x 100 is refused, an untrained model claiming 20 x its samples is cut to 15 times
    the median of the others' (``max-weight-ratio``), a sign-flipped update (as long as an honest one) is taken and its round
    stays finite.  The chains' hops: ``test_one_reply_a_round_is_bounded_...`` above and
    ``tests/integration/test_fuzz.py``."""
    from fedsys_launch.config_schema import make_strategy

    s = make_strategy(cfg(strategy=strategy))
    msgs = configured(s, reply_grid(NODES))
    sent = [protocol.from_record(m.content.array_records["arrays"]) for m in msgs]
    rng = np.random.default_rng(0)
    honest = [{k: (v + rng.normal(0, 0.3, v.shape).astype(v.dtype)
                   if np.issubdtype(v.dtype, np.floating) else v) for k, v in p.items()}
              for p in sent]
    bad, n = honest[0], 10
    if attack == "scaled":
        bad = {k: v * 100 if np.issubdtype(v.dtype, np.floating) else v for k, v in sent[0].items()}
    elif attack == "sign-flipped":
        bad = {k: 2 * sent[0][k] - honest[0][k] if np.issubdtype(v.dtype, np.floating) else v
               for k, v in honest[0].items()}
    else:  # untrained: a model as far from the sent one as a trained one, any direction
        fresh = np.random.default_rng(1)
        bad, n = {k: (v + fresh.normal(0, 0.3, v.shape).astype(v.dtype)
                      if np.issubdtype(v.dtype, np.floating) else v)
                  for k, v in sent[0].items()}, 20 * 10
    replies = [hostile(msgs[0], bad, n), *[hostile(m, h, 10) for m, h in zip(msgs[1:], honest[1:], strict=True)]]
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    got = protocol.from_record(arrays)
    assert all(np.isfinite(v).all() for v in got.values() if np.issubdtype(v.dtype, np.floating))
    if attack == "scaled" and strategy == "dp":
        # issue 65: under DP no bound compares clients (one client's update must not decide
        # another's inclusion); the x100 update is clipped to dp.clipping-norm instead, so
        # it weighs as one clipped update in the sum (until issue 65 it was refused here)
        assert metrics["clients-ok"] == 3 and metrics["dp-clipped"] > 0, strategy
    elif attack == "scaled":
        assert metrics["clients-rejected"] == 1 and "update norm" in caplog.text, strategy
    else:
        assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0, strategy
    if attack == "inflated-count" and strategy != "dp":   # DP counts every update 1 anyway
        assert "claims num-examples 200, more than max-weight-ratio 15" in caplog.text
        assert "counted as 150" in caplog.text


def test_others_medians_are_the_direct_medians_of_the_others() -> None:
    import statistics

    from fedsys.validation import others_medians

    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(2, 40))
        if trial % 3 == 0:  # many ties
            vals = [float(v) for v in rng.integers(0, 4, n)]
        elif trial % 3 == 1:  # ints and floats mixed, as claims and norms may come
            vals = [int(v) if k % 2 else float(v) for k, v in enumerate(rng.integers(0, 50, n))]
        else:
            vals = list(rng.standard_normal(n) * 10.0 ** float(rng.integers(-3, 4)))
        if trial % 25 == 0:  # not all finite: the direct way
            vals[int(rng.integers(0, n))] = float(rng.choice([np.inf, -np.inf, np.nan]))
        keys = [int(k) for k in rng.permutation(10 * n)[:n]]
        values = dict(zip(keys, vals, strict=True))
        got = others_medians(values)
        assert list(got) == keys
        for k in keys:
            want = statistics.median([v for j, v in values.items() if j != k])
            assert got[k] == want or (math.isnan(got[k]) and math.isnan(want)), (values, k)
    with pytest.raises(ValueError, match="two or more"):
        others_medians({1: 1.0})
