"""FedCDA: golden tests of the objective (Eqs. 5, 6, 8), the searches and the strategy.

Reference: Wang et al., "FedCDA: Federated Learning with Cross-Round
Divergence-Aware Aggregation", ICLR 2024; ``../shared/specs/fedcda.md`` §2.4 and §6.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from fedsys import fedcda as m
from fedsys.config import ConfigError
from fedsys.model_cache import ModelCache
from fedsys.params import Params, mean
from fedsys.validation import ClientUpdate
from fedsys_launch.config_schema import build
from strategies.fedavg import FedAvgStrategy
from strategies.fedcda import FedCDAStrategy

RNG = np.random.default_rng(1234)


def eq6_direct(models: list[np.ndarray], losses: list[float], lam: float) -> float:
    return m.eq5_objective(np.stack(models), np.asarray(losses), lam)


# ---------------------------------------------------------------- objective


def test_cached_objective_equals_eq5_on_random_models() -> None:
    for trial in range(5):
        n, d = 3 + trial, 50 + 10 * trial
        models = RNG.normal(size=(n, d)) * (trial + 1)
        losses = RNG.uniform(0, 2, size=n)
        lam = [0.0, 0.5, 1.0, 3.0, 10.0][trial]
        cached = m.objective(losses.sum(), float(np.sum(models**2)), models.sum(axis=0), n, lam)
        assert cached == pytest.approx(eq6_direct(list(models), list(losses), lam), rel=1e-12, abs=1e-12)
        loss, div = m.objective_terms(losses.sum(), float(np.sum(models**2)), models.sum(axis=0), n, lam)
        assert loss == pytest.approx(losses.mean())
        assert div == pytest.approx(0.5 * lam * np.mean(np.sum((models - models.mean(0)) ** 2, 1)))


def test_search_is_exact_for_close_models_far_from_the_origin() -> None:
    """Centring: models 30 units from the origin differing by 1e-3 are still ranked
    correctly (the uncentred mean||w||^2 - ||mean w||^2 loses ~1e-6 of the value)."""
    base = RNG.normal(size=20_000) * 30
    fixed = [base + 1e-3 * RNG.normal(size=base.size) for _ in range(3)]
    cands = [[(base + 1e-3 * RNG.normal(size=base.size)).astype(np.float32) for _ in range(3)]
             for _ in range(2)]
    res = m.search_batch(np.sum(fixed, axis=0), sum(m.sq_norm(x) for x in fixed), 0.0, 3,
                         cands, [[0.0] * 3] * 2, [[0, 1, 2]] * 2, 1.0)
    vals = {}
    for choice in itertools.product(range(3), range(3)):
        ms = fixed + [cands[i][k].astype(np.float64) for i, k in enumerate(choice)]
        c = np.mean(ms, axis=0)
        vals[choice] = 0.5 * np.mean([np.sum((x - c) ** 2) for x in ms])
    assert res.choice == min(vals, key=vals.__getitem__)
    assert res.value == pytest.approx(min(vals.values()), rel=1e-5)


def brute_force_batch(fixed: list[np.ndarray], fixed_losses: list[float], cands, losses, lam):
    best, best_choice = np.inf, None
    for choice in itertools.product(*[range(len(c)) for c in cands]):
        ms = fixed + [cands[i][k] for i, k in enumerate(choice)]
        fs = fixed_losses + [losses[i][k] for i, k in enumerate(choice)]
        j = eq6_direct(ms, fs, lam)
        if j < best - 1e-12:
            best, best_choice = j, choice
    return best, best_choice


@pytest.mark.parametrize("sizes", [(3,), (3, 3), (2, 3, 1), (3, 3, 3, 3)])
def test_search_batch_equals_brute_force_of_eq8(sizes: tuple[int, ...]) -> None:
    d = 40
    fixed = [RNG.normal(size=d) for _ in range(3)]
    fixed_losses = list(RNG.uniform(0, 1, 3))
    cands = [[RNG.normal(size=d) for _ in range(k)] for k in sizes]
    losses = [list(RNG.uniform(0, 1, k)) for k in sizes]
    res = m.search_batch(
        np.sum(fixed, axis=0), sum(m.sq_norm(x) for x in fixed), sum(fixed_losses), len(fixed),
        cands, losses, [list(range(k)) for k in sizes], 1.0,
    )
    best, choice = brute_force_batch(fixed, fixed_losses, cands, losses, 1.0)
    assert res.choice == choice
    assert res.value == pytest.approx(best, rel=1e-10)
    assert res.combinations == int(np.prod(sizes))


def test_search_with_nothing_fixed_is_exhaustive_eq6() -> None:
    cands = [[RNG.normal(size=10) for _ in range(3)] for _ in range(4)]
    losses = [list(RNG.uniform(0, 1, 3)) for _ in range(4)]
    res = m.search_batch(np.zeros(10), 0.0, 0.0, 0, cands, losses, [[1, 2, 3]] * 4, 0.7)
    best, choice = brute_force_batch([], [], cands, losses, 0.7)
    assert res.choice == choice and res.value == pytest.approx(best)


def test_ties_prefer_newer_models() -> None:
    x = RNG.normal(size=8)
    cands = [[x.copy(), x.copy(), x.copy()], [x.copy(), x.copy()]]
    res = m.search_batch(x.copy(), m.sq_norm(x), 0.0, 1, cands, [[0.1] * 3, [0.1] * 2],
                         [[4, 7, 9], [8, 9]], 1.0)
    assert res.choice == (2, 1)


def test_search_limit_is_an_error() -> None:
    with pytest.raises(m.SearchTooLargeError, match="combinations"):
        m.search_batch(np.zeros(2), 0, 0, 0, [[np.zeros(2)] * 40] * 6, [[0.0] * 40] * 6,
                       [[0] * 40] * 6, 1.0)


def test_split_batches_is_array_split_of_a_permutation() -> None:
    rng = np.random.default_rng(0)
    parts = m.split_batches([5, 9, 2, 7], 3, rng)
    assert sorted(len(b) for b in parts) == [1, 1, 2] and [len(b) for b in parts] == [2, 1, 1]
    assert sorted(x for b in parts for x in b) == [2, 5, 7, 9]
    assert m.batch_sizes(10, 3) == [4, 3, 3] and m.batch_sizes(2, 3) == [1, 1]
    assert m.split_batches([3, 1], 5, rng) and len(m.split_batches([3, 1], 5, rng)) == 2


def test_layout_round_trip_puts_trainable_first() -> None:
    p: Params = {
        "conv.weight": RNG.normal(size=(2, 3)).astype(np.float32),
        "bn.running_mean": RNG.normal(size=2).astype(np.float32),
        "bn.num_batches_tracked": np.array(5, dtype=np.int64),
        "fc.bias": RNG.normal(size=4).astype(np.float32),
    }
    lay = m.Layout.of(p)
    assert lay.float_keys == ("conv.weight", "fc.bias", "bn.running_mean")
    assert lay.d_obj == 10 and lay.dim == 12 and lay.int_keys == ("bn.num_batches_tracked",)
    vec, ints = lay.pack(p)
    back = lay.unpack(vec, ints, list(p))
    assert list(back) == list(p)
    for k in p:
        assert back[k].dtype == p[k].dtype and np.array_equal(back[k], p[k])


# ---------------------------------------------------------------- cache


@pytest.mark.parametrize("disk", [False, True])
def test_cache_rolls_oldest_out(tmp_path, disk: bool) -> None:
    c = ModelCache(3, tmp_path / "c" if disk else None)
    for r in range(1, 6):
        c.add(7, r, np.full(4, r, np.float32), 0.1 * r, 4.0 * r * r, {})
    assert [e.round for e in c.of(7)] == [3, 4, 5]
    assert np.array_equal(c.vector(7, 4), np.full(4, 4, np.float32))
    with pytest.raises(KeyError):
        c.entry(7, 2)
    if disk:
        # no checkpoint refers to rounds 1 and 2: their files went when they left the cache
        assert sorted(p.name for p in (tmp_path / "c").glob("*.npy")) == [
            "c000007-r000003.npy", "c000007-r000004.npy", "c000007-r000005.npy"]
        assert c.collect() == 0
        assert c.nbytes_in_ram() == 0
    restored = ModelCache(1, tmp_path / "c" if disk else None)
    restored.load_state_dict(c.state_dict())
    assert [e.round for e in restored.of(7)] == [3, 4, 5]
    assert np.array_equal(restored.vector(7, 5), c.vector(7, 5))


def test_disk_cache_keeps_a_dropped_model_while_a_kept_checkpoint_needs_it(tmp_path) -> None:
    c = ModelCache(1, tmp_path)
    names = lambda: sorted(p.name for p in tmp_path.glob("*.npy"))  # noqa: E731
    c.add(1, 1, np.ones(2, np.float32), 0.0, 2.0, {})
    c.collect()  # checkpoint A refers to round 1
    c.add(1, 2, np.ones(2, np.float32), 0.0, 2.0, {})  # round 1 leaves the cache
    assert names() == ["c000001-r000001.npy", "c000001-r000002.npy"]  # A still needs it
    c.collect()  # checkpoint B (round 2); A is now the previous one: round 1 stays
    assert names() == ["c000001-r000001.npy", "c000001-r000002.npy"]
    c.add(1, 3, np.ones(2, np.float32), 0.0, 2.0, {})
    c.add(1, 4, np.ones(2, np.float32), 0.0, 2.0, {})  # round 3: in no checkpoint, gone now
    assert names() == ["c000001-r000001.npy", "c000001-r000002.npy", "c000001-r000004.npy"]
    assert c.collect() == 1  # checkpoint C (round 4): A is gone, so is round 1
    assert names() == ["c000001-r000002.npy", "c000001-r000004.npy"]


def test_disk_cache_names_missing_truncated_and_foreign_files_on_restore(tmp_path) -> None:
    from fedsys.model_cache import CacheFileError

    c = ModelCache(2, tmp_path)
    for r in (1, 2, 3):
        c.add(1, r, np.ones(10, np.float32), 0.0, 10.0, {})
    state = c.state_dict()
    assert c.check_files() == []
    f = tmp_path / "c000001-r000002.npy"
    f.write_bytes(f.read_bytes()[:-4])
    assert c.check_files() == ["c000001-r000002.npy holds 164 bytes where its header (10,) "
                               "float32 needs 168"]
    f.write_bytes(b"garbage")
    assert "c000001-r000002.npy is not a numpy array file" in c.check_files()[0]
    f.unlink()
    assert c.check_files() == ["c000001-r000002.npy is missing"]
    with pytest.raises(CacheFileError, match=r"1 unusable model file\(s\).*r000002.npy is missing"):
        ModelCache(2, tmp_path).load_state_dict(state)
    np.save(f, np.ones(9, np.float32))  # a whole file of the wrong length
    assert any("disagree on shape or dtype" in b for b in c.check_files())


def flip_bit(path: Path, at: int, mask: int = 0x01) -> bytes:
    """Flip ``mask`` in the byte at ``at`` of ``path`` (the file as long as before); returns
    the new bytes."""
    raw = bytearray(path.read_bytes())
    raw[at] ^= mask
    path.write_bytes(bytes(raw))
    return bytes(raw)


def test_disk_cache_names_a_file_whose_data_changed_after_it_was_written(tmp_path) -> None:
    from fedsys.model_cache import CacheFileError

    c = ModelCache(2, tmp_path)
    vec = np.linspace(-1, 1, 1000, dtype=np.float32)
    c.add(3, 1, vec, 0.0, float(vec @ vec), {})
    c.add(3, 2, vec[::-1], 0.0, float(vec @ vec), {})  # a view: written C-contiguous
    state = c.state_dict()
    assert c.check_files() == []
    f = tmp_path / "c000003-r000001.npy"
    flip_bit(f, -1000)  # one bit of one weight, the file as long as before
    bad = c.check_files()
    assert len(bad) == 1 and bad[0].startswith("c000003-r000001.npy has changed since it was "
                                               "written (CRC-32 "), bad
    with pytest.raises(CacheFileError, match=r"r000001.npy has changed since it was written"):
        ModelCache(2, tmp_path).load_state_dict(state)
    flip_bit(f, -1000)  # the bit back: the file is the one written again
    restored = ModelCache(2, tmp_path)
    restored.load_state_dict(state)
    assert np.array_equal(restored.vector(3, 2), vec[::-1])


def test_disk_cache_checks_a_file_on_its_first_read_in_a_pass(tmp_path) -> None:
    from fedsys.model_cache import CacheFileError

    c = ModelCache(2, tmp_path)
    vec = np.linspace(-1, 1, 1000, dtype=np.float32)
    c.add(3, 1, vec, 0.0, float(vec @ vec), {})
    c.add(3, 2, 2 * vec, 0.0, float(4 * vec @ vec), {})
    assert np.array_equal(c.vector(3, 2), 2 * vec)  # read once: checked, equal
    for rnd in (1, 2):  # one bit of one weight in each, after the write, before a read
        raw = flip_bit(tmp_path / f"c000003-r{rnd:06d}.npy", -1000)
    with pytest.raises(CacheFileError, match=r"c000003-r000001.npy has changed since it was "
                                             r"written \(CRC-32 [0-9a-f]{8}, written "):
        c.vector(3, 1)
    with pytest.raises(CacheFileError):  # still refused: nothing wrong was let through
        c.vector(3, 1)
    # the file read before the change is not read whole again in this pass; the next checks it
    assert not np.array_equal(c.vector(3, 2), 2 * vec)
    c.new_pass()
    with pytest.raises(CacheFileError, match=r"c000003-r000002.npy has changed"):
        c.vector(3, 2)
    # a file cut short or gone: named too, not a bare numpy or OS error
    (tmp_path / "c000003-r000002.npy").write_bytes(raw[:-8])
    with pytest.raises(CacheFileError, match=r"c000003-r000002.npy cannot be read \(.*"):
        c.vector(3, 2)
    (tmp_path / "c000003-r000002.npy").unlink()
    with pytest.raises(CacheFileError, match=r"c000003-r000002.npy is missing"):
        c.vector(3, 2)
    # the RAM store has no files to check
    r = ModelCache(2)
    r.add(3, 1, vec, 0.0, float(vec @ vec), {})
    assert np.array_equal(r.vector(3, 1), vec)


def test_a_cache_file_changed_mid_run_stops_the_strategy_naming_it(tmp_path) -> None:
    from fedsys.model_cache import CacheFileError

    s = FedCDAStrategy.from_config(cfg(**{"fedcda.cache": "disk", "fedcda.warmup": 1,
                                          "fedcda.cache-dir": str(tmp_path)}))
    stream = update_stream(3, [0, 1, 2, 3, 4, 5], seed=5)
    for r, ups in enumerate(stream[:2], 1):
        s.aggregate(r, ups)
    victim = sorted(tmp_path.glob("*.npy"))[0]
    flip_bit(victim, -1, 0x80)
    client = int(victim.name[1:7])  # it read this file last round; this round checks it again
    others = [p for p in range(6) if p != client][:2]
    ups = [upd(p, RNG.normal(size=4) * 3) for p in sorted([client, *others])]
    with pytest.raises(CacheFileError, match=f"{victim.name} has changed since it was written"):
        s.aggregate(3, ups)


def test_adaptive_batches_keeps_the_papers_b_and_bounds_every_search() -> None:
    ab = m.adaptive_batches
    assert ab(10, 3, 3, 4096) == 3  # the paper's setting is untouched
    assert ab(20, 3, 3, 4096) == 3  # batches of 6-7: 3^7 = 2187
    assert ab(50, 3, 3, 4096) == 8 and max(m.batch_sizes(50, 8)) == 7
    assert ab(51, 3, 3, 4096) == 8 and ab(57, 3, 3, 4096) == 9  # ceil(P / 7)
    assert ab(100, 3, 3, 4096) == 15
    assert ab(100, 3, 40, 4096) == 40  # B is a minimum, never lowered
    assert ab(2, 3, 3, 4096) == 2  # never more batches than clients
    assert ab(5, 2, 1, 2) == 5  # one client per batch: K = budget candidates
    for p in range(1, 120):
        for k in (1, 2, 3, 5):
            b = ab(p, k, 3, 1000)
            assert min(3, p) <= b <= p
            assert float(k) ** max(m.batch_sizes(p, b)) <= 1000
            if b > min(3, p):  # and the smallest such count
                assert float(k) ** max(m.batch_sizes(p, b - 1)) > 1000
    with pytest.raises(ValueError, match="budget"):
        ab(10, 3, 3, 2)


# ---------------------------------------------------------------- strategy


def cfg(**kw: object):
    base = {"dataset": "synthetic", "model": "mlp", "num-clients": 6, "clients-per-round": 3,
            "num-server-rounds": 10, "seed": 5, "strategy": "fedcda", "fedcda.warmup": 0}
    return build({**base, **kw})


def model(v: np.ndarray | float, n: int = 3) -> Params:
    w = np.broadcast_to(np.asarray(v, np.float32), (4,)).copy()
    return {"w": w, "count": np.array(n, np.int64)}


def upd(pid: int, v: np.ndarray | float, loss: float = 0.0, n: int = 3, ex: int = 10) -> ClientUpdate:
    return ClientUpdate(100 + pid, pid, model(v, n), ex, {"train-loss": loss})


def test_warmup_equals_fedavg_exactly() -> None:
    c = cfg(**{"fedcda.warmup": 3})
    cda, avg = FedCDAStrategy.from_config(c), FedAvgStrategy.from_config(c)
    for r in range(1, 4):
        ups = [upd(p, RNG.normal(size=4), ex=int(RNG.integers(5, 50))) for p in (0, 2, 4)]
        (a, metrics), b = cda.aggregate(r, ups), avg.aggregate(r, ups).model
        assert a is not None and b is not None
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
        assert metrics["fedcda-warmup"] == 1.0


def test_global_is_uniform_mean_of_seen_clients_and_unseen_are_left_out() -> None:
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.selection": "newest"}))
    g = s.aggregate(1, [upd(0, 1.0, ex=1), upd(1, 2.0, ex=100), upd(3, 6.0, ex=1)]).model
    assert g is not None
    np.testing.assert_allclose(g["w"], 3.0)  # uniform, not example-weighted; 2, 4, 5 unseen
    g, metrics = s.aggregate(2, [upd(0, 4.0), upd(5, 8.0, n=9)])
    assert g is not None
    np.testing.assert_allclose(g["w"], (4 + 2 + 6 + 8) / 4)  # 1 and 3 keep their models
    assert g["count"] == 9 and g["count"].dtype == np.int64  # integer buffers: max
    assert metrics["fedcda-clients-in-mean"] == 4
    assert metrics["fedcda-fresh-fraction"] == 2 / 4  # 0 and 5 trained in round 2


def test_rejected_participant_keeps_previous_selection() -> None:
    s = FedCDAStrategy.from_config(cfg())
    s.aggregate(1, [upd(0, 1.0), upd(1, 5.0)])
    sel_before = dict(s.selected)
    # round 2: client 1 was sampled but its reply was rejected -> not among the updates
    s.aggregate(2, [upd(0, 2.0)])
    assert s.selected[1] == sel_before[1] == 1
    assert [e.round for e in s.cache.of(1)] == [1]  # no partial model cached


def make_known_case() -> list[tuple[FedCDAStrategy, Mapping[str, float]]]:
    """Client 0's newest model drifted far away; its round-1 model sits with the others:
    the strategies (approximate, newest) and their round-2 metrics."""
    out = []
    for sel in ("approximate", "newest"):
        s = FedCDAStrategy.from_config(cfg(**{"fedcda.selection": sel}))
        s.aggregate(1, [upd(0, 1.0), upd(1, 1.1), upd(2, 0.9)])
        out.append((s, s.aggregate(2, [upd(0, 50.0)]).metrics))
    return out


def test_approximate_picks_the_known_answer_and_newest_does_not() -> None:
    (approx, am), (newest, nm) = make_known_case()
    assert approx.selected[0] == 1 and newest.selected[0] == 2
    assert am["fedcda-earlier-models"] == 1
    assert nm["fedcda-earlier-models"] == 0
    assert am["fedcda-objective"] < nm["fedcda-objective"]
    np.testing.assert_allclose(approx.global_model()["w"], 1.0, rtol=1e-6)


def random_fill(s: FedCDAStrategy, rounds: int, clients: list[int], d: int = 6, seed: int = 0
                ) -> Mapping[str, float]:
    """``rounds`` rounds of random updates; the last round's metrics."""
    rng = np.random.default_rng(seed)
    metrics: Mapping[str, float] = {}
    for r in range(1, rounds + 1):
        part = sorted(rng.choice(clients, size=min(3, len(clients)), replace=False).tolist())
        metrics = s.aggregate(r, [upd(p, rng.normal(size=4) * 3, loss=float(rng.uniform()))
                                  for p in part]).metrics
    return metrics


def test_optimal_equals_brute_force_over_all_caches() -> None:
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.selection": "optimal", "fedcda.warmup": 4,
                              "num-clients": 4, "fedcda.smoothness": 0.5}))
    metrics = random_fill(s, 6, [0, 1, 2, 3])
    cache = s.cache
    clients = cache.clients()
    cands = [[np.asarray(cache.vector(n, e.round), np.float64) for e in cache.of(n)] for n in clients]
    losses = [[e.loss for e in cache.of(n)] for n in clients]
    best, choice = brute_force_batch([], [], cands, losses, 0.5)
    assert {n: cache.of(n)[k].round for n, k in zip(clients, choice, strict=True)} == s.selected
    np.testing.assert_allclose(s.global_model()["w"],
                               np.mean([cands[i][k] for i, k in enumerate(choice)], axis=0), rtol=1e-6)
    assert metrics["fedcda-objective"] == pytest.approx(best, rel=1e-9)


def test_greedy_with_one_client_per_batch_equals_per_client_greedy() -> None:
    clients = [0, 1, 2, 3, 4, 5]
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.batches": 3, "fedcda.warmup": 5}))
    random_fill(s, 5, clients)  # warmup: caches filled, newest selected
    before = dict(s.selected)
    cache = s.cache
    rng = np.random.default_rng(77)
    ups = [upd(p, rng.normal(size=4) * 3, loss=float(rng.uniform())) for p in (1, 3, 4)]
    # Expected: the same permutation the strategy draws, one client at a time.
    from fedsys.seeding import derive_seed
    from strategies.fedcda import BATCH_TAG
    order = m.split_batches([1, 3, 4], 3, np.random.default_rng(derive_seed(5, 6, BATCH_TAG)))
    s.aggregate(6, ups)
    fixed = {n: np.asarray(cache.vector(n, r), np.float64) for n, r in before.items() if n not in (1, 3, 4)}
    floss = {n: cache.entry(n, r).loss for n, r in before.items() if n not in (1, 3, 4)}
    for (n,) in order:
        best, best_r = np.inf, None
        for e in cache.of(n):
            j = eq6_direct([*fixed.values(), np.asarray(cache.vector(n, e.round), np.float64)],
                           [*floss.values(), e.loss], 1.0)
            if j < best - 1e-12:
                best, best_r = j, e.round
        assert s.selected[n] == best_r
        fixed[n] = np.asarray(cache.vector(n, best_r), np.float64)
        floss[n] = cache.entry(n, best_r).loss


def test_approximate_batches_exclude_later_batches() -> None:
    """Eq. 8: with B = P, the first client's choice ignores the later participants."""
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.batches": 2, "fedcda.warmup": 1}))
    s.aggregate(1, [upd(0, 0.0), upd(1, 0.0), upd(2, 0.0)])
    before = s.global_model()
    metrics = s.aggregate(2, [upd(0, 0.1), upd(1, 0.2), upd(2, 0.3)]).metrics
    assert set(s.selected.values()) <= {1, 2}
    assert metrics["fedcda-combinations"] == 2 * 2 + 2  # batches of sizes (2, 1)
    assert before is not None


def test_random_and_newest_modes() -> None:
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.selection": "random"}))
    random_fill(s, 8, [0, 1, 2])
    assert all(r in [e.round for e in s.cache.of(n)] for n, r in s.selected.items())
    s2 = FedCDAStrategy.from_config(cfg(**{"fedcda.selection": "random"}))
    random_fill(s2, 8, [0, 1, 2])
    assert s.selected == s2.selected  # seeded


def test_warmup_newest_all_mode_averages_seen_clients_uniformly() -> None:
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.warmup": 5, "fedcda.warmup-mode": "newest-all"}))
    s.aggregate(1, [upd(0, 1.0, ex=1), upd(1, 3.0, ex=9)])
    g = s.aggregate(2, [upd(0, 5.0)]).model
    assert g is not None
    np.testing.assert_allclose(g["w"], 4.0)


def update_stream(rounds: int, clients: list[int], seed: int) -> list[list[ClientUpdate]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        part = sorted(rng.choice(clients, size=3, replace=False).tolist())
        out.append([upd(q, rng.normal(size=4) * 3, loss=float(rng.uniform())) for q in part])
    return out


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_state_dict_resume_is_identical(tmp_path, cache: str) -> None:
    c = cfg(**{"fedcda.cache": cache, "fedcda.warmup": 2, "output-dir": str(tmp_path)})
    stream = update_stream(8, [0, 1, 2, 3, 4, 5], seed=3)
    def in_dir(name: str) -> FedCDAStrategy:  # a disk cache of its own, as fedsys run gives
        return FedCDAStrategy.from_config(
            c.replace(**{"fedcda.cache-dir": str(tmp_path / name / "fedcda-cache")}))

    full = in_dir("full")
    for r, ups in enumerate(stream, 1):
        full.aggregate(r, ups)
    part = in_dir("part")
    for r, ups in enumerate(stream[:6], 1):
        part.aggregate(r, ups)
        part.round = r
        if r == 4:
            state = part.state_dict()
            part.checkpoint_written()
    # killed after round 6; a fresh strategy resumes from the round-4 checkpoint
    part = in_dir("part")
    part.load_state_dict(state)
    for r, ups in enumerate(stream[4:], 5):
        part.aggregate(r, ups)
    assert part.selected == full.selected
    a, b = part.global_model(), full.global_model()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(part.sel_sum, full.sel_sum)


def test_impossible_search_sizes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"optimal.*lower 'num-clients'"):
        FedCDAStrategy.from_config(cfg(**{"fedcda.selection": "optimal", "num-clients": 40}))
    with pytest.raises(ConfigError, match="is not a directory"):
        FedCDAStrategy.from_config(cfg(**{"fedcda.cache": "disk", "fedcda.cache-dir": __file__}))
    with pytest.raises(ConfigError, match=r"fedcda\.search-budget=2 is below K"):
        FedCDAStrategy.from_config(cfg(**{"fedcda.search-budget": 2}))


def test_search_refusal_at_its_edges() -> None:
    """Eq. 8's budget must hold one client's K candidates; Eq. 6 over N clients jointly
    searches K^N combinations, refused above MAX_COMBINATIONS (3^17 = 1.29e8 fits, 3^18 =
    3.87e8 does not); a federation of unknown size is not refused."""
    assert m.search_refusal("approximate", 3, 3, 10) is None
    assert "search-budget=2 is below K" in str(m.search_refusal("approximate", 3, 2, 10))
    assert m.search_refusal("optimal", 3, 1, 17) is None
    assert "K^18" in str(m.search_refusal("optimal", 3, 4096, 18))
    assert m.search_refusal("optimal", 3, 4096, None) is None
    assert m.search_refusal("newest", 3, 1, 10**6) is None


@pytest.mark.parametrize("p", [50, 100])
def test_many_clients_per_round_raise_the_batch_count_and_say_so(p: int, caplog) -> None:
    n = 2 * p
    s = FedCDAStrategy.from_config(cfg(**{"num-clients": n, "clients-per-round": p,
                                          "fedcda.batches": 1, "fedcda.memory": 3}))
    rng = np.random.default_rng(p)
    with caplog.at_level("INFO"):
        for r in range(1, 5):  # every client holds K = 3 models after round 3... then a search
            pids = range(n) if r < 4 else sorted(rng.choice(n, size=p, replace=False))
            new, metrics = s.aggregate(r, [upd(int(c), rng.normal(size=4), loss=float(rng.random()))
                                           for c in pids])
            assert new is not None
    want = m.adaptive_batches(p, 3, 1, 4096)
    assert metrics["fedcda-batches"] == want
    assert metrics["fedcda-combinations"] <= want * 4096
    assert f"{p} participants, K=3: {want} Eq. 8 batches" in caplog.text


def test_disk_cache_driven_through_the_strategy_api_keeps_only_live_files(tmp_path) -> None:
    import gc

    own = tmp_path / "mine"
    s = FedCDAStrategy.from_config(cfg(**{"fedcda.cache": "disk", "fedcda.cache-dir": str(own),
                                          "fedcda.memory": 2}))
    for r in range(1, 21):  # no checkpoint is ever written
        s.aggregate(r, [upd(p, float(r + p)) for p in ((r % 6), (r + 2) % 6, (r + 4) % 6)])
    assert s.cache is not None and s.cache.directory == own
    live = sum(len(s.cache.of(c)) for c in s.cache.clients())
    assert live == 12 and len(list(own.glob("*.npy"))) == live
    # without a directory given and outside fedsys run: a temporary one, gone with the strategy
    t = FedCDAStrategy.from_config(cfg(**{"fedcda.cache": "disk"}))
    t.aggregate(1, [upd(0, 1.0), upd(1, 2.0)])
    assert t.cache is not None and t.cache.directory is not None
    tmp = t.cache.directory
    assert tmp.is_dir() and not tmp.is_relative_to(Path.cwd())
    del t
    gc.collect()
    assert not tmp.exists()


def test_the_warmup_mean_is_the_library_weighted_mean() -> None:
    # guard: the FedAvg used in warmup is the library's weighted mean
    a, b = model(1.0), model(3.0)
    np.testing.assert_allclose(mean([a, b], [1, 3])["w"], 2.5)
