"""Issue 42 item 3: differential privacy on every strategy it describes.  The mechanism on
the maths (clipping, noise), the accounting against the textbook RDP bound of the Gaussian
mechanism, the server- and client-side modes through FedAvg's real reply path, the
compositions it refuses, and why Flower's own DP wrapper does not carry fedsys strategies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsys import protocol
from fedsys.config import ConfigError
from fedsys.dp import add_noise, clip_update, epsilon
from fedsys.seeding import derive_seed
from launch.registry import build, make_strategy
from strategies.dp import NOISE_TAG
from tests.unit.test_base_strategy import NODES, configured, model
from tests.unit.test_update_bounds import hostile


def test_clip_update_golden() -> None:
    ref = {"w": np.zeros(2, np.float32), "n": np.array(3, np.int64)}
    m = {"w": np.array([3.0, 4.0], np.float32), "n": np.array(5, np.int64)}
    out, norm = clip_update(m, ref, 1.0)
    assert norm == 5.0 and np.allclose(out["w"], [0.6, 0.8]) and out["n"] == 5
    same, n2 = clip_update(m, ref, 10.0)
    assert same is m and n2 == 5.0                                        # within C: untouched


def test_noise_is_seeded_gaussian_on_float_entries_only() -> None:
    m = {"w": np.zeros(20000, np.float32), "n": np.array(3, np.int64)}
    a = add_noise(m, 0.5, np.random.default_rng(1))
    b = add_noise(m, 0.5, np.random.default_rng(1))
    assert np.array_equal(a["w"], b["w"]) and a["n"] == 3
    assert abs(float(np.std(a["w"])) - 0.5) < 0.01 and add_noise(m, 0.0, np.random.default_rng(1)) is m


def test_epsilon_is_dp_accountings_rdp_and_below_the_textbook_bound() -> None:
    z, t, delta = 2.0, 10, 1e-5
    # the Gaussian mechanism's RDP, alpha / (2 z^2) per release, converted classically
    bound = min(a * t / (2 * z * z) + math.log(1 / delta) / (a - 1) for a in np.arange(1.5, 200, 0.5))
    got = epsilon(z, t, delta)
    assert 0.5 * bound < got <= bound + 1e-9
    assert epsilon(z, t, delta, population=100, sample=10) < got        # sampling amplifies
    assert epsilon(2 * z, t, delta) < got < epsilon(z, 2 * t, delta)
    assert epsilon(z, 0, delta) == 0.0


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 3,
            "num-server-rounds": 2, "seed": 3, "round-timeout": 2.0, "node-wait-timeout": 0.5,
            "strategy": "dp", "dp.noise-multiplier": 0.5, "dp.clipping-norm": 1.0}
    return build({**base, **kw})


def test_server_side_dp_is_dp_fedavg_clipped_uniform_mean_plus_seeded_noise(reply_grid) -> None:
    s = make_strategy(cfg())
    assert s.composition == "fedavg+dp"
    msgs = configured(s, reply_grid(NODES))                              # sent model(1.0)
    ups = [model(1.0 + d) for d in (0.1, 2.0, -3.0)]                     # norms 0.3, 6, 9
    arrays, metrics = s.aggregate_train(1, [hostile(m, u, 10 * (i + 1))
                                            for i, (m, u) in enumerate(zip(msgs, ups, strict=True))])
    assert arrays is not None and metrics is not None
    ref = model(1.0)
    clipped = [clip_update(u, ref, 1.0)[0] for u in ups]
    want = {k: np.mean([np.asarray(c[k], np.float64) for c in clipped], axis=0) for k in ("w", "b")}
    rng = np.random.default_rng(derive_seed(3, 1, 0, NOISE_TAG))
    got = protocol.from_record(arrays)
    noised = add_noise({k: want[k].astype(np.float32) for k in ("w", "b")} | {"n": ref["n"]},
                       0.5 * 1.0 / 3, rng)
    assert np.allclose(got["w"], noised["w"], atol=1e-6) and np.allclose(got["b"], noised["b"], atol=1e-6)
    assert metrics["dp-noise-std"] == pytest.approx(0.5 / 3)
    assert metrics["dp-clipped"] == pytest.approx(2 / 3)
    assert metrics["dp-epsilon"] == pytest.approx(epsilon(0.5, 1, 1e-5, population=4, sample=3))


def test_client_side_dp_asks_clients_to_clip_and_refuses_an_unclipped_update(reply_grid, caplog) -> None:
    s = make_strategy(cfg(**{"dp.mode": "client"}))
    msgs = configured(s, reply_grid(NODES))
    cfgrec = msgs[0].content.config_records
    assert any(protocol.DP_CLIPPING_NORM in dict(r) for r in cfgrec.values())
    far = {k: v * 5 if np.issubdtype(v.dtype, np.floating) else v for k, v in model(1.0).items()}
    near = clip_update(model(2.0), model(1.0), 1.0)[0]
    _, metrics = s.aggregate_train(1, [hostile(msgs[0], far, 10), hostile(msgs[1], near, 10),
                                       hostile(msgs[2], model(1.1), 10)])
    assert metrics is not None and metrics["clients-ok"] == 2 and metrics["clients-rejected"] == 1
    assert "above dp.clipping-norm 1: the client did not clip" in caplog.text


def test_compositions_the_accountant_does_not_describe_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"dp on fedcda: FedCDA's selection"):
        make_strategy(cfg(**{"dp.base": "fedcda"}))
    with pytest.raises(ConfigError, match=r"dp\.base=ima: DP must be applied first"):
        make_strategy(cfg(**{"dp.base": "ima"}))
    s = make_strategy(cfg(**{"strategy": "ima", "ima.base": "dp"}))    # IMA after DP: fine
    assert s.composition == "fedavg+dp+ima"


def test_flowers_dp_wrapper_cannot_account_for_a_fedsys_strategy() -> None:
    """Flower's wrapper drives a strategy through Flower's ``Strategy.start``, not the
    fedsys strategy's own (hops, resends, checkpoints), and its accountant accepts only
    Flower's ``FedAvg.aggregate_train``."""
    import flwr
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy

    from strategies.fedavg import FedAvgStrategy

    inner = FedAvgStrategy(clients_per_round=3)
    wrapped = DifferentialPrivacyServerSideFixedClipping(inner, 1.0, 1.0, 3)
    assert type(wrapped).start is Strategy.start and type(inner).start is not Strategy.start
    try:
        from flwr.supercore.privacy_accounting import (
            NeighboringRelation,
            PrivacyConfig,
            SamplingMethod,
        )
        from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant
    except ImportError:  # Flower 1.41 has no accounting at all
        assert flwr.__version__.startswith("1.41."), flwr.__version__
        return
    acc = RdpAccountant(PrivacyConfig(1e-5, 4, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                      SamplingMethod.NO_AMPLIFICATION))
    with pytest.raises(ValueError, match=r"requires a strategy using FedAvg\.aggregate_train"):
        DifferentialPrivacyServerSideFixedClipping(inner, 1.0, 1.0, 3, accountant=acc)
