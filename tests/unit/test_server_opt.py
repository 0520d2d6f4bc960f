"""FedAdam / FedYogi server steps (Reddi et al. 2021, Alg. 2; IMA spec §2.5) and FedAvgM's
(Hsu et al. 2019, §3) against hand computations, and IMA placed between the client mean and
the step."""

from __future__ import annotations

import numpy as np
import pytest

from fedsys.server_opt import OptConfig, momentum_step, step
from fedsys.validation import ClientUpdate
from fedsys_launch.config_schema import build, make_strategy
from strategies import REGISTRY


def test_adam_step_by_hand() -> None:
    w = {"x": np.array([1.0, -2.0], np.float32), "n": np.array(3, np.int64)}
    agg = {"x": np.array([1.5, -2.5], np.float32), "n": np.array(5, np.int64)}
    m, v = {}, {}
    cfg = OptConfig(lr=0.01, tau=1e-3, beta1=0.9, beta2=0.99)
    out = step("adam", w, agg, m, v, 1, cfg)
    d = np.array([0.5, -0.5])
    m1, v1 = 0.1 * d, 0.01 * d * d
    np.testing.assert_allclose(out["x"], w["x"] + 0.01 * m1 / (np.sqrt(v1) + 1e-3), rtol=1e-6)
    assert out["n"] == 5 and out["x"].dtype == np.float32
    out2 = step("adam", out, agg, m, v, 2, cfg)
    d2 = agg["x"].astype(np.float64) - out["x"]
    m2, v2 = 0.9 * m1 + 0.1 * d2, 0.99 * v1 + 0.01 * d2 * d2
    np.testing.assert_allclose(out2["x"], out["x"] + 0.01 * m2 / (np.sqrt(v2) + 1e-3), rtol=1e-6)


def test_yogi_second_moment_and_bias_correction() -> None:
    w = {"x": np.zeros(2, np.float32)}
    agg = {"x": np.array([0.2, -0.4], np.float32)}
    m, v = {}, {"x": np.array([1.0, 0.0])}
    out = step("yogi", w, agg, m, v, 3, OptConfig(bias_correction=True))
    d = agg["x"].astype(np.float64)
    v_exp = np.array([1.0, 0.0]) - 0.01 * d * d * np.sign(np.array([1.0, 0.0]) - d * d)
    np.testing.assert_allclose(v["x"], v_exp)
    lr = 0.01 * np.sqrt(1 - 0.99**3) / (1 - 0.9**3)  # Flower's legacy FedAdam correction
    np.testing.assert_allclose(out["x"], lr * 0.1 * d / (np.sqrt(v_exp) + 1e-3), rtol=1e-6)
    with pytest.raises(ValueError):
        step("sgd", w, agg, {}, {}, 1, OptConfig())


def test_fedavgm_momentum_step_by_hand() -> None:
    """v = Delta at the first step, then v = beta v + Delta; w - eta v; integers from the
    aggregate; eta 1 and beta 0 return the aggregate itself (FedAvg)."""
    w = {"x": np.array([1.0, -2.0], np.float32), "n": np.array(3, np.int64)}
    agg = {"x": np.array([0.5, -1.0], np.float32), "n": np.array(5, np.int64)}
    vel: dict[str, np.ndarray] = {}
    out = momentum_step(w, agg, vel, 0.5, 0.9)
    np.testing.assert_allclose(vel["x"], [0.5, -1.0])
    np.testing.assert_allclose(out["x"], [0.75, -1.5])
    assert out["n"] == 5 and out["x"].dtype == np.float32
    out2 = momentum_step(out, agg, vel, 0.5, 0.9)  # Delta = [0.25, -0.5]
    np.testing.assert_allclose(vel["x"], [0.9 * 0.5 + 0.25, 0.9 * -1.0 - 0.5])
    np.testing.assert_allclose(out2["x"], [0.75 - 0.5 * 0.7, -1.5 - 0.5 * -1.4], rtol=1e-6)
    none: dict[str, np.ndarray] = {}
    momentum_step(w, agg, none, 0.5, 0.0)
    assert none == {}  # no momentum, no velocity kept (as Flower's)
    assert momentum_step(w, agg, {}, 1.0, 0.0) is agg


def test_fedavgm_checkpoint_keeps_the_velocity(reply_grid) -> None:  # type: ignore[no-untyped-def]
    from strategies.fedavgm import FedAvgMStrategy

    s = FedAvgMStrategy(server_learning_rate=0.5, server_momentum=0.9)
    s.params = {"x": np.zeros(2, np.float32)}
    s.velocity = {"x": np.array([0.1, 0.2])}
    t = FedAvgMStrategy(server_learning_rate=0.5, server_momentum=0.9)
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.velocity["x"], [0.1, 0.2])
    s.velocity["x"][0] = 9.0
    assert t.velocity["x"][0] == 0.1  # a copy


def cfg(**kw: object):
    return build({"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 2,
                  "num-server-rounds": 6, "strategy": "ima", "ima.base": "fedadam", **kw})


def ups(r: int) -> list[ClientUpdate]:
    rng = np.random.default_rng(r)
    return [ClientUpdate(1, 0, {"x": rng.normal(size=3).astype(np.float32)}, 5),
            ClientUpdate(2, 1, {"x": rng.normal(size=3).astype(np.float32)}, 15)]


def test_ima_averages_client_means_before_the_adam_step() -> None:
    c = cfg(**{"ima.start-round": 2, "ima.window": 2})
    s, plain = make_strategy(c), REGISTRY["fedadam"].from_config(c)
    s.params = plain.params = {"x": np.zeros(3, np.float32)}
    for r in range(1, 6):
        a, b = s.aggregated(r, ups(r)).model, plain.aggregated(r, ups(r)).model
        if r <= 2:  # t = r - 1 < t_s = 2: identical
            np.testing.assert_array_equal(a["x"], b["x"])
        s.params, plain.params = a, b
    means = [np.average([u.params["x"] for u in ups(r)], axis=0, weights=[5, 15]) for r in (4, 5)]
    np.testing.assert_allclose(s.wrappers[0].windows[0][0]["x"], means[0], rtol=1e-6)  # pre-step means
    np.testing.assert_allclose(s.wrappers[0].windows[0][1]["x"], means[1], rtol=1e-6)
    assert s.wrappers[0].round_metrics()["ima-active"] == 1.0
    assert not np.array_equal(s.params["x"], plain.params["x"])
