"""Issue 42 item 2: robust aggregation as a wrapper.  Golden values of the three rules
(Yin et al. 2018 Defs. 1-2; Blanchard et al. 2017 §4), and, per method, the step the
wrapper replaces: FedAvg's weighted mean (against the x 100 attack, with the update
bounds off so that the rule is the only defence), FedCDA's uniform mean of the selected
models (its selection unchanged), FedCross's mean of the K slots, a chain refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedsys.config import ConfigError
from fedsys.params import Params
from fedsys.robust import coordinate_median, krum_scores, multi_krum, trimmed_mean
from fedsys.validation import ClientUpdate
from launch.registry import build, make_strategy
from strategies.fedcda import FedCDAStrategy
from strategies.robust import Robust


def vec(*v: float) -> Params:
    return {"w": np.array(v, np.float32), "n": np.array(len(v), np.int64)}


def test_coordinate_median_and_trimmed_mean_golden() -> None:
    ms = [vec(1, 10), vec(2, -5), vec(100, 0), vec(3, 1)]
    got = coordinate_median(ms)
    assert got["w"].tolist() == [2.5, 0.5] and got["w"].dtype == np.float32
    assert got["n"] == 2 and got["n"].dtype == np.int64                  # integers: the maximum
    assert trimmed_mean(ms, 0.25)["w"].tolist() == [2.5, 0.5]            # drops 1 at each end
    assert trimmed_mean(ms, 0.0)["w"].tolist() == [26.5, 1.5]            # beta 0: the mean
    assert coordinate_median([vec(1, 2), vec(3, 4), vec(5, 60)])["w"].tolist() == [3, 4]
    with pytest.raises(ValueError, match="beta"):
        trimmed_mean(ms, 0.5)


def test_krum_scores_and_multi_krum_golden() -> None:
    ms = [vec(0, 0), vec(1, 0), vec(0, 1), vec(10, 10)]
    # n = 4, f = 1: each model's 1 nearest other; squared distances
    assert krum_scores(ms, 1).tolist() == [1.0, 1.0, 1.0, 181.0]
    out, kept = multi_krum(ms, 1)                                         # m = n - f = 3
    assert kept == [0, 1, 2] and np.allclose(out["w"], [1 / 3, 1 / 3])
    assert multi_krum(ms, 1, 1)[1] == [0]                                 # Krum: the first best
    with pytest.raises(ValueError, match="keeping 5 of 4"):
        multi_krum(ms, 1, 5)


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 6, "clients-per-round": 4,
            "num-server-rounds": 10, "seed": 5, "max-update-ratio": 0, "max-weight-share": 0}
    return build({**base, **kw})


def upd(pid: int, v: float | list[float], ex: int = 10, loss: float = 0.0) -> ClientUpdate:
    w = np.broadcast_to(np.asarray(v, np.float32), (2,)).copy()
    return ClientUpdate(100 + pid, pid, {"w": w, "n": np.array(3, np.int64)}, ex, {"train-loss": loss})


@pytest.mark.parametrize(("rule", "want"), [("median", 1.5), ("trimmed-mean", 1.5),
                                            ("multi-krum", 4 / 3)])
def test_fedavg_with_a_rule_ignores_a_scaled_model_and_any_claim(rule: str, want: float) -> None:
    s = make_strategy(cfg(**{"strategy": "robust", "robust.base": "fedavg", "robust.rule": rule,
                             "robust.trim": 0.25}))
    assert s.composition == "fedavg+robust"
    ups = [upd(0, 1.0), upd(1, 2.0, ex=1000), upd(2, 1.0), upd(3, 100.0)]
    got = s.aggregate(1, ups)
    assert got is not None and np.allclose(got["w"], want)               # the 100 is out
    assert s.wrapper_metrics()["robust-kept"] == (3.0 if rule == "multi-krum" else 4.0)


def test_fedcda_keeps_its_selection_and_the_rule_replaces_the_mean_of_the_selected() -> None:
    c = {"strategy": "robust", "robust.base": "fedcda", "fedcda.warmup": 0,
         "fedcda.selection": "newest"}
    s = make_strategy(cfg(**c))
    plain = FedCDAStrategy.from_config(cfg(**{**c, "strategy": "fedcda"}))
    rounds = [[upd(0, 1.0), upd(1, 2.0), upd(3, 50.0)], [upd(0, 4.0), upd(5, 8.0)]]
    for r, ups in enumerate(rounds, start=1):
        got, base = s.aggregate(r, ups), plain.aggregate(r, ups)
        assert got is not None and base is not None
        assert s.selected == plain.selected                                # Eq. 8's choice unchanged
        want = coordinate_median(plain.selected_models())
        assert np.array_equal(got["w"], want["w"])
    assert np.allclose(got["w"], 6.0) and np.allclose(base["w"], (4 + 2 + 50 + 8) / 4)


def test_fedcross_global_model_is_the_rule_over_its_slots_after_its_own_mixing() -> None:
    s = make_strategy(cfg(**{"strategy": "robust", "robust.base": "fedcross"}))
    s.slots = [{"w": np.full(2, v, np.float32), "n": np.array(1, np.int64)} for v in (1, 2, 3, 4)]
    s.assignment = {100 + i: i for i in range(4)}
    got = s.aggregate(1, [upd(0, 1.5), upd(1, 2.5), upd(2, 3.5), upd(3, 400.0)])
    assert got is not None
    assert np.array_equal(got["w"], coordinate_median(s.slots)["w"])     # the K slots' median
    assert float(got["w"][0]) < 10 < 300 < max(float(m["w"][0]) for m in s.slots)  # mean: ~102


def test_a_chain_is_refused_at_start_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"robust on fedseq: a chain .* takes no mean"):
        make_strategy(cfg(**{"strategy": "robust", "robust.base": "fedseq"}))
    with pytest.raises(ConfigError, match=r"robust\.rule"):
        cfg(**{"strategy": "robust", "robust.rule": "mean"})
    s = make_strategy(cfg(**{"strategy": "robust", "robust.base": "oneshot-fedavg"}))
    assert isinstance(s.wrappers[0], Robust)
