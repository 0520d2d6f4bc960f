"""IMA: window maths, start-round boundaries, the lr schedule of spec §2.4, and
composition with the base strategies (bit-for-bit before t_s)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsys import ima
from fedsys.params import Params, mean
from fedsys.validation import ClientUpdate
from fedsys_launch.config_schema import build, make_strategy
from strategies import REGISTRY
from strategies.ima import IMA

RNG = np.random.default_rng(7)


def model(v: float | np.ndarray, n: int = 1) -> Params:
    return {"w": np.broadcast_to(np.asarray(v, np.float32), (3,)).copy(),
            "bn.num_batches_tracked": np.array(n, np.int64)}


def upd(pid: int, v: float | np.ndarray, ex: int = 10, n: int = 1) -> ClientUpdate:
    return ClientUpdate(100 + pid, pid, model(v, n), ex, {"train-loss": 0.5})


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 6, "clients-per-round": 3,
            "num-server-rounds": 8, "seed": 1, "strategy": "ima", "lr": 0.01}
    return build({**base, **kw})


# ---------------------------------------------------------------- maths


@pytest.mark.parametrize(("total", "t_s", "at_ts", "fma_end", "ima_end"), [
    (300, 225, 1.042e-3, 4.954e-4, 1.094e-4),
    (400, 300, 4.904e-4, 1.813e-4, 2.404e-5),
    (200, 150, 2.215e-3, 1.353e-3, 4.978e-4),
])
def test_lr_schedule_matches_the_worked_numbers(total, t_s, at_ts, fma_end, ima_end) -> None:
    assert ima.start_round(total, 0.75) == t_s
    assert ima.client_lr(t_s, 0.01, 0.99, t_s, 0.97) == pytest.approx(at_ts, rel=2e-3)
    assert ima.client_lr(total - 1, 0.01, 0.99, None, 0.97) == pytest.approx(fma_end, rel=2e-3)
    assert ima.client_lr(total - 1, 0.01, 0.99, t_s, 0.97) == pytest.approx(ima_end, rel=2e-3)
    assert ima.client_lr(t_s - 1, 0.01, 0.99, t_s, 0.97) == pytest.approx(0.01 * 0.99 ** (t_s - 1))


def test_start_round_explicit_overrides_fraction() -> None:
    assert ima.start_round(100, 0.75, explicit=3) == 3
    assert ima.start_round(100, 0.0) == 0 and ima.start_round(10, 1.0) == 10


def test_window_mean_averages_floats_and_takes_the_largest_int_buffer() -> None:
    ms = [model(float(i), n=i) for i in range(1, 5)]
    out = mean(ms)
    np.testing.assert_allclose(out["w"], 2.5)
    assert out["w"].dtype == np.float32
    assert out["bn.num_batches_tracked"] == 4 and out["bn.num_batches_tracked"].dtype == np.int64


def test_averaging_active_boundaries() -> None:
    assert not ima.averaging_active(4, 5, 5) and ima.averaging_active(5, 5, 5)
    assert ima.averaging_active(0, 0, 5)  # t_s = 0: averages what there is from round 1
    assert not ima.averaging_active(2, 1, 5, strict_code_rule=True)  # code waits for t >= P
    assert ima.averaging_active(5, 1, 5, strict_code_rule=True)


# ---------------------------------------------------------------- strategy


def run(strategy, stream: list[list[ClientUpdate]]) -> list[Params]:
    outs = []
    for r, ups in enumerate(stream, 1):
        out = strategy.aggregated(r, ups).model
        strategy.params = out
        outs.append(out)
    return outs


def stream(rounds: int = 8, seed: int = 0) -> list[list[ClientUpdate]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        part = sorted(rng.choice(6, size=3, replace=False).tolist())
        out.append([upd(p, rng.normal(size=3), ex=int(rng.integers(5, 30))) for p in part])
    return out


def test_window_rolls_and_holds_base_models_not_ima_outputs() -> None:
    s = make_strategy(cfg(**{"ima.start-round": 2, "ima.window": 3}))
    fma = [float(v) for v in (1, 2, 3, 4, 5)]
    outs = run(s, [[upd(0, v)] for v in fma])
    np.testing.assert_allclose([o["w"][0] for o in outs], [1, 2, 2, 3, 4])  # means of (1,2,3),(2,3,4),(3,4,5)
    assert [w["w"][0] for w in s.wrappers[0].windows[0]] == [3.0, 4.0, 5.0]


def test_start_before_window_fills_averages_what_is_there() -> None:
    s = make_strategy(cfg(**{"ima.start-round": 0, "ima.window": 5}))
    outs = run(s, [[upd(0, v)] for v in (2.0, 4.0, 9.0)])
    np.testing.assert_allclose([o["w"][0] for o in outs], [2.0, 3.0, 5.0])
    code = make_strategy(cfg(**{"ima.start-round": 0, "ima.window": 2, "ima.code-start-rule": True}))
    outs = run(code, [[upd(0, v)] for v in (2.0, 4.0, 9.0)])
    np.testing.assert_allclose([o["w"][0] for o in outs], [2.0, 4.0, 6.5])


def test_averaging_off_is_the_decay_only_control() -> None:
    c = cfg(**{"ima.start-round": 0, "ima.average": False, "lr-decay": 0.9, "ima.lr-decay": 0.5})
    s = make_strategy(c)
    avg = REGISTRY["fedavg"].from_config(c)
    st = stream()
    for a, b in zip(run(s, st), run(avg, st), strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert s.client_lr(3, c.lr) == pytest.approx(0.01 * 0.5**2)  # t_s = 0: only the IMA decay
    assert avg.client_lr(3, c.lr) == pytest.approx(0.01 * 0.9**2)


@pytest.mark.parametrize("base", ["fedavg", "fedprox", "fedcda"])
def test_composition_is_the_base_bit_for_bit_before_t_s(base: str) -> None:
    extra = {"fedcda.warmup": 2} if base == "fedcda" else {}
    c = cfg(**{"ima.base": base, "ima.start-round": 5, **extra})
    s, b = make_strategy(c), REGISTRY[base].from_config(c)
    assert isinstance(s.wrappers[0], IMA) and type(s) is REGISTRY[base]
    assert s.trainer == b.trainer
    st = stream()
    outs_s, outs_b = run(s, st), run(b, st)
    for r in range(5):  # rounds 1..5 are t = 0..4 < t_s
        assert all(np.array_equal(outs_s[r][k], outs_b[r][k]) for k in outs_b[r])
        assert s.client_lr(r + 1, c.lr) == b.client_lr(r + 1, c.lr)
    assert not np.array_equal(outs_s[6]["w"], outs_b[6]["w"])  # averaging from t = 5
    if base == "fedcda":
        assert s.selected == b.selected  # IMA never touches the base's own state


def test_ima_state_round_trip_resumes_identically() -> None:
    c = cfg(**{"ima.start-round": 2, "ima.window": 3})
    st = stream(8, seed=3)
    full = make_strategy(c)
    ref = run(full, st)
    part = make_strategy(c)
    run(part, st[:4])
    part.round = 4
    state = part.state_dict()
    resumed = make_strategy(c)
    resumed.load_state_dict(state)
    outs = run_from(resumed, st, 5)
    for a, b in zip(outs, ref[4:], strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def run_from(strategy, st, first: int) -> list[Params]:
    outs = []
    for r in range(first, len(st) + 1):
        out = strategy.aggregated(r, st[r - 1]).model
        strategy.params = out
        outs.append(out)
    return outs


def test_fedcross_base_keeps_one_window_per_slot() -> None:
    """IMA over FedCross (fedsys's extension): before t_s the slots are FedCross's bit for
    bit; from t_s each slot is the mean of its own last P models, and the global model is
    the mean of the averaged slots."""
    c = cfg(**{"ima.base": "fedcross", "ima.start-round": 2, "ima.window": 2,
               "clients-per-round": 3, "fedcross.selection": "in-order"})
    s, b = make_strategy(c), REGISTRY["fedcross"].from_config(c)
    for st in (s, b):
        st.params = model(0.0)
        st._ensure_slots()
    rng = np.random.default_rng(5)
    for r in range(1, 5):
        ups = [upd(p, rng.normal(size=3)) for p in range(3)]
        for st in (s, b):
            st.assignment = {100 + p: (p + r) % 3 for p in range(3)}
        out_b = b.aggregated(r, ups).model
        out_s = s.aggregated(r, ups).model
        if r <= 2:  # t = 0, 1 < t_s = 2
            for i in range(3):
                np.testing.assert_array_equal(s.slots[i]["w"], b.slots[i]["w"])
            np.testing.assert_array_equal(out_s["w"], out_b["w"])
            continue
        # from t_s the two runs see different slot models, so compare with IMA's own windows
        for i in range(3):
            np.testing.assert_allclose(
                s.slots[i]["w"], np.mean([w["w"] for w in s.wrappers[0].windows[i]], axis=0), rtol=1e-6)
            assert len(s.wrappers[0].windows[i]) == 2
        np.testing.assert_allclose(out_s["w"], np.mean([sl["w"] for sl in s.slots], axis=0),
                                   rtol=1e-6)
        assert s.wrappers[0].round_metrics()["ima-active"] == 1.0


def test_a_checkpoint_from_before_wrappers_still_resumes() -> None:
    """Runs checkpointed when IMA was a strategy named 'ima' (windows under 'ima') resume."""
    c = cfg(**{"ima.start-round": 1, "ima.window": 3})
    s = make_strategy(c)
    run(s, stream(4, seed=1))
    new = s.state_dict()
    old = {k: v for k, v in new.items() if k not in ("wrappers", "usable_rounds")}
    old.update(name="ima", ima={int(k): w for k, w in new["wrappers"]["ima"].items()})
    back = make_strategy(c)
    back.load_state_dict(old)
    assert back.round == s.round and back.usable_rounds == s.round
    for k, w in s.wrappers[0].windows.items():
        assert all(np.array_equal(a["w"], b["w"]) for a, b in zip(w, back.wrappers[0].windows[k],
                                                                   strict=True))


@pytest.mark.parametrize("base", ["fedavg", "fedcda"])
def test_a_branch_may_change_averaging_and_its_decay_up_to_t_s_only(base: str) -> None:
    """IMA's branch rule (``branch_late_keys``): t_s = 3 of 4 rounds here."""
    strategy = make_strategy(build({"strategy": "ima", "ima.base": base, "ima.start-round": 3,
                                    "num-server-rounds": 4, "fedcda.warmup": 1}))
    late = {"ima.average", "ima.lr-decay"}
    assert [strategy.branch_late_keys(r) == late for r in range(5)] == [True] * 4 + [False]
    assert make_strategy(build({"strategy": base, "fedcda.warmup": 1})).branch_late_keys(1) \
        == frozenset()
    refusal = strategy.branch_refusal()  # the base's own rule holds under IMA too
    assert refusal is None
    disk = make_strategy(build({"strategy": "ima", "ima.base": base, "fedcda.cache": "disk",
                                "fedcda.warmup": 1}))
    assert (disk.branch_refusal() is not None) == (base == "fedcda")
