"""The partitioners: iid, dirichlet, shards; their properties (disjoint, complete, sizes,
class counts, determinism), histograms and errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedsys import partition as part
from fedsys.partition import (
    PartitionError,
    class_histogram,
    dirichlet,
    iid,
    plot_histogram,
    shards,
)

NUM_CLASSES = 10
N_SAMPLES = 3000
LABELS = np.random.default_rng(42).integers(0, NUM_CLASSES, size=N_SAMPLES)
# Balanced and label-sorted: 300 samples of each class, in class order.
SORTED_LABELS = np.repeat(np.arange(NUM_CLASSES), N_SAMPLES // NUM_CLASSES)

CLIENT_SEED = list(itertools.product((1, 3, 10, 25), (0, 7)))


def _assert_valid_partition(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert isinstance(parts, list)
    assert len(parts) == num_clients
    for p in parts:
        assert isinstance(p, np.ndarray)
        assert p.dtype == np.int64
        assert p.ndim == 1
        assert np.all(np.diff(p) > 0), "indices must be strictly increasing (sorted, unique)"
    allidx = np.concatenate(parts)
    # disjoint: no index appears twice across clients
    assert len(np.unique(allidx)) == len(allidx)
    # complete: union is exactly 0..n-1
    assert len(allidx) == n
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


# ----------------------------------------------------------------------------- iid


@pytest.mark.parametrize(("num_clients", "seed"), CLIENT_SEED)
def test_iid_disjoint_complete_balanced(num_clients, seed):
    parts = iid(LABELS, num_clients, seed)
    _assert_valid_partition(parts, N_SAMPLES, num_clients)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n", [7, 101, 3001])
def test_iid_uneven_sizes_differ_by_at_most_one(n):
    labels = np.zeros(n, dtype=np.int64)
    parts = iid(labels, 6, seed=3)
    _assert_valid_partition(parts, n, 6)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == n


def test_iid_one_sample_per_client():
    parts = iid(np.arange(5), 5, seed=0)
    _assert_valid_partition(parts, 5, 5)
    assert all(len(p) == 1 for p in parts)


# ------------------------------------------------------------------------ dirichlet


@pytest.mark.parametrize(("num_clients", "seed"), CLIENT_SEED)
@pytest.mark.parametrize("alpha", [0.1, 0.5, 100.0])
def test_dirichlet_disjoint_complete_min_size(num_clients, seed, alpha):
    min_size = 10
    parts = dirichlet(LABELS, num_clients, seed, alpha=alpha, min_size=min_size)
    _assert_valid_partition(parts, N_SAMPLES, num_clients)
    assert min(len(p) for p in parts) >= min_size


def test_dirichlet_larger_min_size_is_respected():
    parts = dirichlet(LABELS, 10, seed=1, alpha=0.5, min_size=100)
    _assert_valid_partition(parts, N_SAMPLES, 10)
    assert min(len(p) for p in parts) >= 100


def _mean_major_classes(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean number of classes that hold >= 5% of a client's data."""
    hist = class_histogram(labels, parts, NUM_CLASSES)
    frac = hist / hist.sum(axis=1, keepdims=True)
    return float((frac >= 0.05).sum(axis=1).mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_small_alpha_more_skewed_than_large_alpha(seed):
    skewed = dirichlet(LABELS, 10, seed, alpha=0.1, min_size=10)
    uniform = dirichlet(LABELS, 10, seed, alpha=100.0, min_size=10)
    k_skewed = _mean_major_classes(skewed, LABELS)
    k_uniform = _mean_major_classes(uniform, LABELS)
    assert k_skewed < k_uniform
    # alpha=100 is close to iid: nearly every class is a major class of every client
    assert k_uniform >= 9.0
    # alpha=0.1 concentrates clients on few classes
    assert k_skewed <= 5.0


def test_dirichlet_large_alpha_matches_global_label_distribution():
    parts = dirichlet(LABELS, 5, seed=0, alpha=1000.0, min_size=10)
    hist = class_histogram(LABELS, parts, NUM_CLASSES)
    client_frac = hist / hist.sum(axis=1, keepdims=True)
    global_frac = np.bincount(LABELS, minlength=NUM_CLASSES) / N_SAMPLES
    assert np.max(np.abs(client_frac - global_frac)) < 0.05


# --------------------------------------------------------------------------- shards


@pytest.mark.parametrize(("num_clients", "seed"), CLIENT_SEED)
@pytest.mark.parametrize("spc", [1, 2, 3])
def test_shards_disjoint_complete_sizes(num_clients, seed, spc):
    parts = shards(LABELS, num_clients, seed, shards_per_client=spc)
    _assert_valid_partition(parts, N_SAMPLES, num_clients)
    shard_size = N_SAMPLES / (num_clients * spc)
    for p in parts:
        # each shard has floor or ceil of n / (N*S) samples
        assert spc * np.floor(shard_size) <= len(p) <= spc * np.ceil(shard_size)
        assert abs(len(p) - spc * shard_size) <= spc


def test_shards_exact_size_when_divisible():
    parts = shards(LABELS, 10, seed=0, shards_per_client=2)
    assert [len(p) for p in parts] == [300] * 10


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_shards_on_balanced_sorted_labels_give_at_most_spc_classes(seed):
    # 300 samples per class, shards of 150: every shard lies inside one class.
    parts = shards(SORTED_LABELS, 10, seed, shards_per_client=2)
    _assert_valid_partition(parts, N_SAMPLES, 10)
    for p in parts:
        assert len(np.unique(SORTED_LABELS[p])) <= 2


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_shards_label_skew_on_random_labels(seed):
    spc = 2
    parts = shards(LABELS, 10, seed, shards_per_client=spc)
    classes = np.array([len(np.unique(LABELS[p])) for p in parts])
    # shard size (150) is below every class count (~300), so a shard straddles at
    # most one class boundary: at most 2 classes per shard, 2*spc per client.
    assert classes.max() <= 2 * spc
    # typical client: at most spc + 1 classes
    assert np.median(classes) <= spc + 1
    # and far from iid (iid clients hold all 10 classes)
    assert classes.max() < NUM_CLASSES


def test_shards_one_shard_is_contiguous_in_label_order():
    # spc=1: a client's labels span a contiguous range of classes
    parts = shards(LABELS, 20, seed=5, shards_per_client=1)
    for p in parts:
        cls = np.unique(LABELS[p])
        assert cls.max() - cls.min() + 1 == len(cls)


# ---------------------------------------------------------------------- histogram


@pytest.mark.parametrize(
    "parts_fn",
    [
        lambda: iid(LABELS, 7, 0),
        lambda: dirichlet(LABELS, 7, 0, alpha=0.3),
        lambda: shards(LABELS, 7, 0, shards_per_client=2),
    ],
    ids=["iid", "dirichlet", "shards"],
)
def test_class_histogram_margins(parts_fn):
    parts = parts_fn()
    hist = class_histogram(LABELS, parts, NUM_CLASSES)
    assert hist.shape == (7, NUM_CLASSES)
    np.testing.assert_array_equal(hist.sum(axis=1), [len(p) for p in parts])
    np.testing.assert_array_equal(hist.sum(axis=0), np.bincount(LABELS, minlength=NUM_CLASSES))


def test_class_histogram_hand_example():
    labels = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1], dtype=np.int64), np.array([2, 3, 4, 5], dtype=np.int64)]
    hist = class_histogram(labels, parts, num_classes=4)
    np.testing.assert_array_equal(hist, [[1, 1, 0, 0], [0, 1, 3, 0]])


def test_plot_histogram_writes_png(tmp_path):
    parts = dirichlet(LABELS, 5, 0, alpha=0.3)
    hist = class_histogram(LABELS, parts, NUM_CLASSES)
    target = tmp_path / "sub" / "hist.png"
    out = plot_histogram(hist, target, "test")
    assert out == target
    data = target.read_bytes()
    assert len(data) > 1000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


# -------------------------------------------------------------------- determinism


SPLITS = {
    "iid": lambda seed: iid(LABELS, 10, seed),
    "dirichlet": lambda seed: dirichlet(LABELS, 10, seed, alpha=0.3),
    "shards": lambda seed: shards(LABELS, 10, seed, shards_per_client=2),
}


@pytest.mark.parametrize("kind", sorted(SPLITS))
def test_same_seed_same_partition(kind):
    a, b = SPLITS[kind](3), SPLITS[kind](3)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kind", sorted(SPLITS))
def test_different_seed_different_partition(kind):
    a, b = SPLITS[kind](3), SPLITS[kind](4)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_labels_input_not_modified():
    labels = LABELS.copy()
    dirichlet(labels, 5, 0, alpha=0.3)
    shards(labels, 5, 0, shards_per_client=2)
    iid(labels, 5, 0)
    np.testing.assert_array_equal(labels, LABELS)


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize("num_clients", [0, -1])
@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_num_clients_below_one_rejected(kind, num_clients):
    fn = {
        "iid": lambda: iid(LABELS, num_clients, 0),
        "dirichlet": lambda: dirichlet(LABELS, num_clients, 0, alpha=0.3),
        "shards": lambda: shards(LABELS, num_clients, 0, shards_per_client=2),
    }[kind]
    with pytest.raises(PartitionError, match="num-clients"):
        fn()


def test_more_clients_than_samples_rejected():
    with pytest.raises(PartitionError):
        iid(np.arange(5), 6, 0)


@pytest.mark.parametrize("alpha", [0.0, -0.5])
def test_dirichlet_nonpositive_alpha_rejected(alpha):
    with pytest.raises(PartitionError, match="alpha"):
        dirichlet(LABELS, 10, 0, alpha=alpha)


def test_dirichlet_impossible_min_size_rejected():
    # 10 clients x 301 samples > 3000 samples
    with pytest.raises(PartitionError, match="min-size"):
        dirichlet(LABELS, 10, 0, alpha=0.3, min_size=301)


def test_dirichlet_unreachable_min_size_gives_up():
    # Possible in principle (10 x 290 <= 3000) but no tiny-alpha draw gets there.
    with pytest.raises(PartitionError, match="tries"):
        dirichlet(LABELS, 10, 0, alpha=0.01, min_size=290, max_tries=5)


def test_shards_too_many_shards_rejected():
    # 100 clients x 40 shards = 4000 shards > 3000 samples
    with pytest.raises(PartitionError, match="shards"):
        shards(LABELS, 100, 0, shards_per_client=40)


@pytest.mark.parametrize("spc", [0, -2])
def test_shards_per_client_below_one_rejected(spc):
    with pytest.raises(PartitionError, match="shards-per-client"):
        shards(LABELS, 10, 0, shards_per_client=spc)


def test_partition_error_is_value_error():
    assert issubclass(PartitionError, ValueError)


PROP_LABELS = np.random.default_rng(0).integers(0, 10, size=3000)
CASES = list(itertools.product((1, 7, 20), (0, 5)))


def split(kind: str, n: int, seed: int, **kw: float) -> list[np.ndarray]:
    if kind == "iid":
        return part.iid(PROP_LABELS, n, seed)
    if kind == "dirichlet":
        return part.dirichlet(PROP_LABELS, n, seed, kw.get("alpha", 0.3), int(kw.get("min_size", 10)))
    return part.shards(PROP_LABELS, n, seed, int(kw.get("spc", 2)))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_disjoint_complete_sorted(kind, n, seed):
    parts = split(kind, n, seed)
    assert len(parts) == n
    allidx = np.concatenate(parts)
    assert len(allidx) == len(PROP_LABELS)  # complete and ...
    assert len(np.unique(allidx)) == len(PROP_LABELS)  # ... disjoint
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_deterministic_in_the_seed(kind):
    a, b, c = split(kind, 10, 3), split(kind, 10, 3), split(kind, 10, 4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_differ_by_at_most_one_and_match_label_mix():
    parts = part.iid(PROP_LABELS, 7, 1)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    hist = part.class_histogram(PROP_LABELS, parts, 10) / np.array(sizes)[:, None]
    assert np.abs(hist - np.bincount(PROP_LABELS) / len(PROP_LABELS)).max() < 0.06


def _classes_held(parts: list[np.ndarray], share: float = 0.05) -> float:
    h = part.class_histogram(PROP_LABELS, parts, 10)
    return float(((h / h.sum(1, keepdims=True)) >= share).sum(1).mean())


def test_dirichlet_min_size_and_skew_follows_alpha():
    for seed in range(3):
        parts = part.dirichlet(PROP_LABELS, 20, seed, alpha=0.1, min_size=25)
        assert min(len(p) for p in parts) >= 25
    skewed = np.mean([_classes_held(part.dirichlet(PROP_LABELS, 20, s, 0.1)) for s in range(3)])
    mixed = np.mean([_classes_held(part.dirichlet(PROP_LABELS, 20, s, 100.0)) for s in range(3)])
    assert skewed < 5 < mixed


@pytest.mark.parametrize("spc", [1, 2, 4])
def test_shards_sizes_and_few_classes(spc):
    n = 10
    parts = part.shards(PROP_LABELS, n, 2, spc)
    shard = len(PROP_LABELS) / (n * spc)
    for p in parts:
        assert abs(len(p) - spc * shard) <= spc
    held = (part.class_histogram(PROP_LABELS, parts, 10) > 0).sum(1)
    assert held.max() <= 2 * spc  # a shard may straddle one class boundary
    assert np.median(held) <= spc + 1


def test_class_histogram_sums():
    parts = part.dirichlet(PROP_LABELS, 8, 0, 0.5)
    h = part.class_histogram(PROP_LABELS, parts, 10)
    assert h.shape == (8, 10)
    np.testing.assert_array_equal(h.sum(1), [len(p) for p in parts])
    np.testing.assert_array_equal(h.sum(0), np.bincount(PROP_LABELS, minlength=10))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: part.iid(PROP_LABELS, 0, 0), "num-clients"),
        (lambda: part.dirichlet(PROP_LABELS, 5, 0, 0.0), "dirichlet-alpha"),
        (lambda: part.dirichlet(PROP_LABELS, 5, 0, 0.3, min_size=700), "dirichlet-min-size"),
        (lambda: part.shards(PROP_LABELS, 5, 0, 0), "shards-per-client"),
        (lambda: part.shards(PROP_LABELS[:9], 5, 0, 2), "shards exceed"),
        (lambda: part.iid(PROP_LABELS[:3], 5, 0), "cannot split"),
    ],
)
def test_impossible_partitions_raise_clear_errors(call, match):
    with pytest.raises(part.PartitionError, match=match):
        call()


def test_plot_histogram_writes_png_prop(tmp_path):
    parts = part.shards(PROP_LABELS, 6, 0, 2)
    out = part.plot_histogram(part.class_histogram(PROP_LABELS, parts, 10), tmp_path / "h.png", "t")
    assert out.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------- domain shift


def test_domains_cycle_through_four_kinds_with_seeded_parameters():
    from fedsys.domains import KINDS, domain_of

    doms = [domain_of(k, 3) for k in range(8)]
    assert [d.kind for d in doms] == [*KINDS, *KINDS]
    assert doms == [domain_of(k, 3) for k in range(8)]                   # fixed per seed
    assert any(domain_of(k, 3) != domain_of(k, 4) for k in (0, 2, 3))    # the seed matters
    assert all(d.value in (90.0, 180.0, 270.0) for d in doms if d.kind == "rotate")


def test_domain_transforms_keep_shape_and_dtype_and_change_the_images():
    import torch

    from fedsys.domains import Domain, apply

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (5, 1, 28, 28), generator=g, dtype=torch.uint8)
    for d in [Domain(0, "rotate", 90.0), Domain(1, "invert", 0.0), Domain(2, "blur", 1.2),
              Domain(3, "contrast", 0.3)]:
        y = apply(d, x)
        assert y.shape == x.shape and y.dtype == torch.uint8 and not torch.equal(x, y)
    assert torch.equal(apply(Domain(0, "invert", 0), apply(Domain(0, "invert", 0), x)), x)
    r = Domain(0, "rotate", 90.0)
    assert torch.equal(apply(r, apply(r, apply(r, apply(r, x)))), x)
    c = apply(Domain(0, "contrast", 0.3), x).float()
    assert c.std() < 0.35 * x.float().std()                              # less contrast
    flat = torch.full((1, 1, 9, 9), 77, dtype=torch.uint8)
    assert torch.equal(apply(Domain(0, "blur", 1.5), flat), flat)        # blur keeps flat areas


def test_domain_partition_gives_each_client_its_transformed_iid_share():
    import torch

    from fedsys import domains
    from fedsys.task import client_data, dataset, partitions, test_sets
    from fedsys_launch.config_schema import build

    cfg = build({"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 4,
                 "partition": "domain", "seed": 2, "test-subset": 50})
    iid = build({**cfg.to_dict(), "partition": "iid"})
    assert [p.tolist() for p in partitions(cfg)] == [p.tolist() for p in partitions(iid)]
    ds = dataset(cfg)
    for k in range(4):
        x, y = client_data(cfg, k)
        idx = torch.from_numpy(partitions(cfg)[k])
        assert torch.equal(y, ds.y_train[idx])
        assert torch.equal(x, domains.apply(domains.domain_of(k, 2), ds.x_train[idx]))
    sets = test_sets(cfg)
    assert [s[0] for s in sets] == [f"domain-{k}" for k in range(4)]
    assert all(len(s[2]) == 50 for s in sets)
    assert [s[0] for s in test_sets(iid)] == [""]


# --- samples-per-client: the small-data regime of LSS spec 5.1 ---------------------------

def test_subsample_caps_each_client_keeps_subsets_and_small_clients_whole():
    parts = dirichlet(LABELS, 6, 3, 0.5)
    cap = int(np.median([len(p) for p in parts]))
    out = part.subsample(parts, cap, 3)
    assert len(out) == len(parts)
    for before, after in zip(parts, out, strict=True):
        assert len(after) == min(len(before), cap)
        assert np.all(np.diff(after) > 0) and after.dtype == np.int64
        assert np.isin(after, before).all()
        if len(before) <= cap:
            assert np.array_equal(before, after)
    assert part.subsample(parts, 0, 3) == parts


def test_subsample_is_seeded_and_keeps_each_clients_label_mix():
    parts = dirichlet(LABELS, 4, 1, 0.3)
    a, b = part.subsample(parts, 300, 9), part.subsample(parts, 300, 9)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = part.subsample(parts, 300, 10)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    # uniform draw: each client's class shares stay within sampling noise of its own
    full = class_histogram(LABELS, parts, NUM_CLASSES) / np.array([[len(p)] for p in parts])
    kept = class_histogram(LABELS, a, NUM_CLASSES) / 300.0
    assert np.abs(full - kept).max() < 0.1


def test_subsample_rejects_negative_cap():
    with pytest.raises(PartitionError, match="samples-per-client"):
        part.subsample([np.arange(5)], -1, 0)


# ------------------------------------------------------- dirichlet-balanced (Lin et al.)


@pytest.mark.parametrize(("n", "seed", "alpha"), [(10, 0, 0.5), (10, 3, 0.1), (20, 1, 0.3),
                                                  (7, 2, 0.3), (25, 0, 1.0)])
def test_dirichlet_balanced_caps_every_client_at_the_average_of_its_block(n, seed, alpha):
    """Lin et al.'s rule: classes are dealt in order and a client at or above its block's
    average gets no more, so before its last class (its highest label) it was below the
    average; no client is below half of it."""
    parts = part.dirichlet_balanced(PROP_LABELS, n, seed, alpha)
    _assert_valid_partition(parts, len(PROP_LABELS), n)
    blocks = [parts[g:g + 10] for g in range(0, n, 10)]
    for block in blocks:
        avg = sum(len(p) for p in block) / len(block)
        for p in block:
            last = PROP_LABELS[p].max()
            assert len(p) - np.count_nonzero(PROP_LABELS[p] == last) < avg
            assert len(p) >= 0.5 * avg


@pytest.mark.parametrize(("split", "n"), [(part.dirichlet_balanced, 10),
                                          (part.dirichlet_capped, 12)])
def test_capped_splits_deal_the_first_class_as_drawn(split, n):
    """The first class (every client still open) goes out in the proportions of the first
    Dirichlet draw, taken after the seeded shuffle: the label mix follows the draws (Lin et
    al.'s one block of 10; FedLab's one block of all N clients, the same stream)."""
    seed, alpha = 4, 0.5
    parts = split(PROP_LABELS, n, seed, alpha)
    rng = np.random.default_rng(seed)
    rng.permutation(len(PROP_LABELS))
    p = rng.dirichlet(np.full(n, alpha))
    first = int(np.unique(PROP_LABELS)[0])
    total = np.count_nonzero(PROP_LABELS == first)
    want = np.diff(np.concatenate([[0], (np.cumsum(p)[:-1] * total).astype(np.int64), [total]]))
    got = [np.count_nonzero(PROP_LABELS[q] == first) for q in parts]
    np.testing.assert_array_equal(got, want)


def test_dirichlet_balanced_sizes_spread_less_than_plain_dirichlet_with_the_same_skew():
    plain = [part.size_spread(part.dirichlet(PROP_LABELS, 20, s, 0.3))["cv"] for s in range(4)]
    capped = [part.size_spread(part.dirichlet_balanced(PROP_LABELS, 20, s, 0.3))["cv"]
              for s in range(4)]
    assert max(capped) < min(plain) or np.mean(capped) < 0.6 * np.mean(plain), (capped, plain)
    skewed = np.mean([_classes_held(part.dirichlet_balanced(PROP_LABELS, 20, s, 0.1))
                      for s in range(3)])
    mixed = np.mean([_classes_held(part.dirichlet_balanced(PROP_LABELS, 20, s, 100.0))
                     for s in range(3)])
    assert skewed < 5 < mixed


@pytest.mark.parametrize("split", [part.dirichlet_balanced, part.dirichlet_capped])
def test_capped_splits_are_seeded_and_refuse_a_bad_alpha(split):
    a, b = split(LABELS, 10, 3, 0.3), split(LABELS, 10, 3, 0.3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = split(LABELS, 10, 4, 0.3)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    with pytest.raises(PartitionError, match="dirichlet-alpha"):
        split(LABELS, 10, 0, 0.0)


def test_size_spread_hand_example():
    s = part.size_spread([np.arange(2), np.arange(4), np.arange(6)])
    assert s == {"min": 2.0, "max": 6.0, "mean": 4.0, "cv": pytest.approx(np.std([2, 4, 6]) / 4)}


# ------------------------------------------------ dirichlet-capped (FedCross's, IMA's code)


@pytest.mark.parametrize(("n", "seed", "alpha"), [(10, 0, 0.5), (20, 1, 0.1), (7, 2, 0.3),
                                                  (25, 0, 1.0)])
def test_dirichlet_capped_caps_every_client_at_the_average_and_keeps_the_minimum(n, seed, alpha):
    """FedLab's rule over all clients at once, classes dealt in label order: once a client
    holds the average (len / N) it gets nothing of a later class, but for the one sample the
    code's float cut can leave to the last client; every client holds at least
    dirichlet-min-size samples."""
    parts = part.dirichlet_capped(PROP_LABELS, n, seed, alpha, min_size=10)
    _assert_valid_partition(parts, len(PROP_LABELS), n)
    avg = len(PROP_LABELS) / n
    for p in parts:
        counts = np.bincount(PROP_LABELS[p], minlength=10)
        held_before = np.concatenate([[0], np.cumsum(counts)[:-1]])
        assert all(c <= 1 for c, h in zip(counts, held_before, strict=True) if h >= avg), counts
        assert len(p) >= 10


def test_dirichlet_capped_spreads_sizes_between_plain_and_balanced():
    """No client far past the average (unlike plain Dirichlet), but not held near it either
    (unlike Lin et al.'s blocks): the coefficient of variation lies between the two."""
    cv = {name: np.mean([part.size_spread(f(PROP_LABELS, 20, s, 0.3))["cv"] for s in range(4)])
          for name, f in (("plain", part.dirichlet), ("capped", part.dirichlet_capped),
                          ("balanced", part.dirichlet_balanced))}
    assert cv["balanced"] < cv["capped"] < cv["plain"], cv
    big = max(len(p) for s in range(4) for p in part.dirichlet_capped(PROP_LABELS, 20, s, 0.3))
    # a client overshoots the average by at most the one class it got while below it
    assert big < len(PROP_LABELS) / 20 + np.bincount(PROP_LABELS).max()


def test_dirichlet_capped_refuses_a_minimum_it_cannot_meet():
    with pytest.raises(PartitionError, match="dirichlet-min-size"):
        part.dirichlet_capped(LABELS, 10, 0, 0.3, min_size=len(LABELS))
    with pytest.raises(PartitionError, match="dirichlet-min-size; the average"):
        part.dirichlet_capped(LABELS, 10, 0, 0.3, min_size=len(LABELS) // 10, max_tries=3)
