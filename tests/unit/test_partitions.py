"""Properties of the partitioners: disjoint, complete, sizes, class counts, determinism."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedsys import partition as part

LABELS = np.random.default_rng(0).integers(0, 10, size=3000)
CASES = list(itertools.product((1, 7, 20), (0, 5)))


def split(kind: str, n: int, seed: int, **kw: float) -> list[np.ndarray]:
    if kind == "iid":
        return part.iid(LABELS, n, seed)
    if kind == "dirichlet":
        return part.dirichlet(LABELS, n, seed, kw.get("alpha", 0.3), int(kw.get("min_size", 10)))
    return part.shards(LABELS, n, seed, int(kw.get("spc", 2)))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_disjoint_complete_sorted(kind, n, seed):
    parts = split(kind, n, seed)
    assert len(parts) == n
    allidx = np.concatenate(parts)
    assert len(allidx) == len(LABELS)  # complete and ...
    assert len(np.unique(allidx)) == len(LABELS)  # ... disjoint
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_deterministic_in_the_seed(kind):
    a, b, c = split(kind, 10, 3), split(kind, 10, 3), split(kind, 10, 4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_differ_by_at_most_one_and_match_label_mix():
    parts = part.iid(LABELS, 7, 1)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    hist = part.class_histogram(LABELS, parts, 10) / np.array(sizes)[:, None]
    assert np.abs(hist - np.bincount(LABELS) / len(LABELS)).max() < 0.06


def _classes_held(parts: list[np.ndarray], share: float = 0.05) -> float:
    h = part.class_histogram(LABELS, parts, 10)
    return float(((h / h.sum(1, keepdims=True)) >= share).sum(1).mean())


def test_dirichlet_min_size_and_skew_follows_alpha():
    for seed in range(3):
        parts = part.dirichlet(LABELS, 20, seed, alpha=0.1, min_size=25)
        assert min(len(p) for p in parts) >= 25
    skewed = np.mean([_classes_held(part.dirichlet(LABELS, 20, s, 0.1)) for s in range(3)])
    mixed = np.mean([_classes_held(part.dirichlet(LABELS, 20, s, 100.0)) for s in range(3)])
    assert skewed < 5 < mixed


@pytest.mark.parametrize("spc", [1, 2, 4])
def test_shards_sizes_and_few_classes(spc):
    n = 10
    parts = part.shards(LABELS, n, 2, spc)
    shard = len(LABELS) / (n * spc)
    for p in parts:
        assert abs(len(p) - spc * shard) <= spc
    held = (part.class_histogram(LABELS, parts, 10) > 0).sum(1)
    assert held.max() <= 2 * spc  # a shard may straddle one class boundary
    assert np.median(held) <= spc + 1


def test_class_histogram_sums():
    parts = part.dirichlet(LABELS, 8, 0, 0.5)
    h = part.class_histogram(LABELS, parts, 10)
    assert h.shape == (8, 10)
    np.testing.assert_array_equal(h.sum(1), [len(p) for p in parts])
    np.testing.assert_array_equal(h.sum(0), np.bincount(LABELS, minlength=10))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: part.iid(LABELS, 0, 0), "num-clients"),
        (lambda: part.dirichlet(LABELS, 5, 0, 0.0), "dirichlet-alpha"),
        (lambda: part.dirichlet(LABELS, 5, 0, 0.3, min_size=700), "dirichlet-min-size"),
        (lambda: part.shards(LABELS, 5, 0, 0), "shards-per-client"),
        (lambda: part.shards(LABELS[:9], 5, 0, 2), "shards exceed"),
        (lambda: part.iid(LABELS[:3], 5, 0), "cannot split"),
    ],
)
def test_impossible_partitions_raise_clear_errors(call, match):
    with pytest.raises(part.PartitionError, match=match):
        call()


def test_plot_histogram_writes_png(tmp_path):
    parts = part.shards(LABELS, 6, 0, 2)
    out = part.plot_histogram(part.class_histogram(LABELS, parts, 10), tmp_path / "h.png", "t")
    assert out.read_bytes()[:4] == b"\x89PNG"
