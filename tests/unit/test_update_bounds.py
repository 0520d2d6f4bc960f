"""Issue 42 item 1: the bounds every strategy puts on a reply by default, against the two
finite attacks that got through before (a model x 100; an untrained model claiming 20 x its
samples), on the maths (golden values) and through a strategy's real reply path with
replies built as a ClientApp builds them (``Message(content, reply_to=instruction)``)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedsys import protocol
from fedsys.params import distance, mean
from fedsys.validation import capped_claims, norm_refusals
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
    assert capped_claims({1: 20.0, 2: 1.0}, 0.5) == {}                  # two: no cap
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 0) == {}            # cap off
    assert capped_claims({1: 20.0, 2: 1.0, 3: 1.0}, 1) == {}
    n = {1: 20.0, 2: 1.0, 3: 1.0}
    cut = {**n, **capped_claims(n, 0.5)}
    assert cut[1] / sum(cut.values()) == pytest.approx(0.5)


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
    want = mean([model(1.0 + 0.1 * i) for i in (1, 2)], [10 * (p + 1) for p in pids])
    got = protocol.from_record(arrays)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_an_untrained_model_claiming_20x_gets_at_most_half_of_fedavgs_mean(reply_grid, caplog):
    s = FedAvgStrategy.from_config(cfg())
    msgs = configured(s, reply_grid(NODES))
    honest = [hostile(m, model(1.1), 100) for m in msgs[1:]]
    fresh = hostile(msgs[0], model(0.9), 20 * 100)   # a fresh model, 20 x the samples
    arrays, metrics = s.aggregate_train(1, [*honest, fresh])
    assert metrics is not None and metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0
    got = protocol.from_record(arrays)
    # counted as 200 (the others' sum): exactly half of the mean
    want = mean([model(0.9), model(1.1), model(1.1)], [200, 100, 100])
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert "claims num-examples 2000" in caplog.text and "counted as 200" in caplog.text
    before = mean([model(0.9), model(1.1), model(1.1)], [2000, 100, 100])
    assert abs(float(before["w"][0, 0]) - 0.9) < 0.02    # without the cap: ~91 % its model


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
    assert s.replies.earlier == [pytest.approx(distance(model(v), model(1.0))) for v in (1.2, 1.1)]
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


ROUND_BASED = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedcda", "fedcross", "ima", "robust", "dp"]


@pytest.mark.parametrize("strategy", ROUND_BASED)
@pytest.mark.parametrize("attack", ["scaled", "sign-flipped", "inflated-count"])
def test_the_finite_attacks_under_every_round_based_strategy(strategy, attack, reply_grid, caplog):
    """The fuzz suite's finite attacks (issue 42 item 5) through each strategy's reply path:
    a model x 100 is refused, an untrained model claiming 20 x its samples is cut to half of
    a weighted mean, a sign-flipped update (as long as an honest one) is taken and its round
    stays finite.  The chains' hops: ``test_one_reply_a_round_is_bounded_...`` above and
    ``tests/integration/test_fuzz.py``."""
    from launch.registry import make_strategy

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
    if attack == "scaled":
        assert metrics["clients-rejected"] == 1 and "update norm" in caplog.text, strategy
    else:
        assert metrics["clients-ok"] == 3 and metrics["clients-rejected"] == 0, strategy
    if attack == "inflated-count" and strategy != "dp":   # DP counts every update 1 anyway
        assert "claims num-examples 200" in caplog.text and "counted as 20" in caplog.text
