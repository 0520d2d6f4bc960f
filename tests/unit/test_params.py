"""Parameter conversion, update checks, the one mean and flattening of models, the model
registry and the data loaders."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch
from torch import nn

from fedsys import data as data
from fedsys import params as fp
from fedsys import protocol
from fedsys.models import build_model
from fedsys.params import check_update, checksum, flatten, from_torch, mean, to_torch


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    # make the BatchNorm buffers non-trivial
    net.train()
    net(torch.randn(4, 1, 4, 4))
    net(torch.randn(4, 1, 4, 4))
    return net


def _ref() -> fp.Params:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([0.5, -1.5], dtype=np.float64),
        "n": np.array(7, dtype=np.int64),
    }


# --------------------------------------------------------------------- conversion


def test_from_torch_keeps_keys_order_dtypes_values():
    net = _net()
    sd = net.state_dict()
    assert "1.num_batches_tracked" in sd
    p = fp.from_torch(sd)
    assert list(p) == list(sd)
    for k, t in sd.items():
        assert isinstance(p[k], np.ndarray)
        assert p[k].shape == tuple(t.shape)
        np.testing.assert_array_equal(p[k], t.numpy())
    assert p["1.num_batches_tracked"].dtype == np.int64
    assert int(p["1.num_batches_tracked"]) == 2
    assert p["0.weight"].dtype == np.float32


def test_from_torch_is_a_copy():
    net = _net()
    p = fp.from_torch(net.state_dict())
    before = p["0.weight"].copy()
    with torch.no_grad():
        net[0].weight.add_(1.0)
    np.testing.assert_array_equal(p["0.weight"], before)


def test_torch_roundtrip_into_fresh_model():
    net = _net()
    p = fp.from_torch(net.state_dict())
    sd = fp.to_torch(p)
    assert list(sd) == list(p)
    for k, t in sd.items():
        assert isinstance(t, torch.Tensor)
        assert t.dtype == net.state_dict()[k].dtype
        assert t.device.type == "cpu"
    torch.manual_seed(123)
    fresh = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    fresh.load_state_dict(sd, strict=True)
    for k, t in fresh.state_dict().items():
        assert torch.equal(t, net.state_dict()[k]), k
    assert fresh[1].num_batches_tracked.dtype == torch.int64
    # numpy -> torch -> numpy is the identity
    back = fp.from_torch(sd)
    assert fp.checksum(back) == fp.checksum(p)


def test_to_torch_does_not_share_memory():
    p = _ref()
    sd = fp.to_torch(p)
    sd["w"][0, 0] = 100.0
    assert p["w"][0, 0] == 0.0


def test_to_torch_accepts_non_contiguous():
    p = {"t": np.arange(6, dtype=np.float32).reshape(2, 3).T}
    sd = fp.to_torch(p)
    assert torch.equal(sd["t"], torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))


def test_copy_is_deep():
    p = _ref()
    q = fp.copy(p)
    q["w"][0, 0] = 42.0
    assert p["w"][0, 0] == 0.0
    assert list(q) == list(p)


def test_num_bytes():
    assert fp.num_bytes(_ref()) == 6 * 4 + 2 * 8 + 8


# ---------------------------------------------------------------------- checksum


def test_checksum_stable_and_sensitive():
    p = _ref()
    c = fp.checksum(p)
    assert c == fp.checksum(fp.copy(p))
    q = fp.copy(p)
    q["w"][1, 2] = np.nextafter(q["w"][1, 2], np.float32(np.inf))
    assert fp.checksum(q) != c
    r = fp.copy(p)
    r["n"] = np.array(8, dtype=np.int64)
    assert fp.checksum(r) != c


def test_checksum_sensitive_to_dtype_shape_and_order():
    p = _ref()
    c = fp.checksum(p)
    assert fp.checksum({**p, "b": p["b"].astype(np.float32)}) != c
    assert fp.checksum({**p, "w": p["w"].reshape(3, 2)}) != c
    reordered = {k: p[k] for k in reversed(list(p))}
    assert fp.checksum(reordered) != c


# ------------------------------------------------------------------ check_update


def test_check_update_accepts_good_update():
    ref = _ref()
    upd = fp.copy(ref)
    upd["w"] += 1.0
    assert fp.check_update(upd, ref) is None
    assert fp.check_update(ref, ref) is None


def test_check_update_missing_key():
    ref = _ref()
    upd = fp.copy(ref)
    del upd["b"]
    msg = fp.check_update(upd, ref)
    assert msg is not None and "'b'" in msg and "missing" in msg


def test_check_update_extra_key():
    ref = _ref()
    upd = {**fp.copy(ref), "extra": np.zeros(1, dtype=np.float32)}
    msg = fp.check_update(upd, ref)
    assert msg is not None and "'extra'" in msg


def test_check_update_shape_mismatch():
    ref = _ref()
    upd = {**fp.copy(ref), "w": np.zeros((3, 2), dtype=np.float32)}
    msg = fp.check_update(upd, ref)
    assert msg is not None and "'w'" in msg and "shape" in msg


def test_check_update_dtype_mismatch():
    ref = _ref()
    upd = {**fp.copy(ref), "b": ref["b"].astype(np.float32)}
    msg = fp.check_update(upd, ref)
    assert msg is not None and "'b'" in msg and "dtype" in msg


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("key", ["w", "b"])
def test_check_update_non_finite(key, bad):
    ref = _ref()
    upd = fp.copy(ref)
    upd[key].flat[-1] = bad
    msg = fp.check_update(upd, ref)
    assert msg is not None and f"'{key}'" in msg and "NaN or Inf" in msg


def test_check_update_integer_arrays_not_checked_for_finiteness():
    ref = _ref()
    upd = fp.copy(ref)
    upd["n"] = np.array(np.iinfo(np.int64).max, dtype=np.int64)
    assert fp.check_update(upd, ref) is None


# ---------------------------------------------------------------------- flatten


def test_flatten_float_only():
    p = _ref()
    v = fp.flatten(p)
    assert v.dtype == np.float64
    assert len(v) == 6 + 2  # the int64 entry is left out
    np.testing.assert_array_equal(v, [0, 1, 2, 3, 4, 5, 0.5, -1.5])


def test_unflatten_inverts_flatten_and_keeps_integers():
    ref = _ref()
    back = fp.unflatten(fp.flatten(ref) + 1.0, ref)
    assert list(back) == list(ref)
    for k, v in ref.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        if np.issubdtype(v.dtype, np.floating):
            np.testing.assert_allclose(back[k], v + 1.0)
        else:
            np.testing.assert_array_equal(back[k], v)
    with pytest.raises(ValueError, match="entries"):
        fp.unflatten(np.zeros(3), ref)


def test_flatten_model_counts_float_elements():
    p = fp.from_torch(_net().state_dict())
    n_float = sum(v.size for v in p.values() if np.issubdtype(v.dtype, np.floating))
    assert len(fp.flatten(p)) == n_float
    assert fp.flatten(p).dtype == np.float64


def test_flatten_empty():
    assert len(fp.flatten({"n": np.array([1, 2], dtype=np.int64)})) == 0


# ------------------------------------------------------------- mean (weighted)


def _models() -> list[fp.Params]:
    return [
        {
            "w": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
            "b": np.array([0.0], dtype=np.float64),
            "n": np.array(10, dtype=np.int64),
        },
        {
            "w": np.array([[3.0, 0.0], [-3.0, 8.0]], dtype=np.float32),
            "b": np.array([6.0], dtype=np.float64),
            "n": np.array(20, dtype=np.int64),
        },
        {
            "w": np.array([[5.0, 4.0], [9.0, 0.0]], dtype=np.float32),
            "b": np.array([-6.0], dtype=np.float64),
            "n": np.array(30, dtype=np.int64),
        },
    ]


def test_weighted_average_golden():
    out = mean(_models(), [1, 2, 3])
    # (1*m1 + 2*m2 + 3*m3) / 6, computed by hand:
    # w[0,0] = (1 + 6 + 15)/6 = 22/6 ; w[0,1] = (2 + 0 + 12)/6 = 14/6
    # w[1,0] = (3 - 6 + 27)/6 = 24/6 ; w[1,1] = (4 + 16 + 0)/6 = 20/6
    # b = (0 + 12 - 18)/6 = -1
    np.testing.assert_allclose(out["w"], np.array([[22, 14], [24, 20]]) / 6.0, rtol=1e-6)
    np.testing.assert_allclose(out["b"], [-1.0], rtol=0, atol=1e-12)
    assert out["n"] == 30  # from the model with the largest weight
    assert list(out) == ["w", "b", "n"]


def test_weighted_average_equal_weights_is_mean():
    models = _models()
    out = mean(models, [5, 5, 5])
    np.testing.assert_allclose(out["w"], np.mean([m["w"] for m in models], axis=0), rtol=1e-6)
    np.testing.assert_allclose(out["b"], np.mean([m["b"] for m in models], axis=0))


def test_weighted_average_weights_are_normalised():
    models = _models()
    a = mean(models, [1, 2, 3])
    b = mean(models, [10, 20, 30])
    c = mean(models, [0.1, 0.2, 0.3])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6)
        np.testing.assert_allclose(a[k], c[k], rtol=1e-6)


def test_weighted_average_preserves_dtypes():
    out = mean(_models(), [1, 2, 3])
    assert out["w"].dtype == np.float32
    assert out["b"].dtype == np.float64
    assert out["n"].dtype == np.int64


def test_integer_entry_is_the_elementwise_maximum_whatever_the_weights():
    """The one rule for integer buffers (num_batches_tracked): the largest count."""
    models = _models()
    assert mean(models, [5, 1, 1])["n"] == 30
    assert mean(models, [1, 7, 2])["n"] == 30
    assert mean(models)["n"] == 30
    assert mean(models[:2])["n"] == 20


def test_weighted_average_single_model_is_identity():
    m = _models()[1]
    out = mean([m], [4])
    for k in m:
        np.testing.assert_array_equal(out[k], m[k])


def test_weighted_average_zero_weight_ignores_model():
    models = _models()
    models[2]["w"][:] = np.float32(1e30)
    out = mean(models, [1, 1, 0])
    np.testing.assert_allclose(out["w"], (models[0]["w"] + models[1]["w"]) / 2, rtol=1e-6)


def test_weighted_average_does_not_modify_inputs():
    models = _models()
    before = [fp.checksum(m) for m in models]
    out = mean(models, [1, 2, 3])
    out["n"][...] = -1
    assert [fp.checksum(m) for m in models] == before


def test_weighted_average_errors():
    models = _models()
    with pytest.raises(ValueError):
        mean([], [])
    with pytest.raises(ValueError):
        mean(models, [1, 2])
    with pytest.raises(ValueError):
        mean(models, [1, -1, 3])
    with pytest.raises(ValueError):
        mean(models, [0, 0, 0])


def bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))


def test_torch_numpy_flower_roundtrip_keeps_keys_order_dtypes_values():
    sd = bn_model().state_dict()
    p = from_torch(sd)
    assert list(p) == list(sd)
    assert p["1.num_batches_tracked"].dtype == np.int64 and p["1.num_batches_tracked"].shape == ()
    back = to_torch(protocol.from_record(protocol.to_record(p)))
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_check_update_names_what_is_wrong():
    ref = from_torch(bn_model().state_dict())
    assert check_update({k: v.copy() for k, v in ref.items()}, ref) is None
    w = "0.weight"
    cases = {
        "missing arrays": {k: v for k, v in ref.items() if k != w},
        "unexpected arrays": {**ref, "zz": np.zeros(1, np.float32)},
        "has shape": {**ref, w: np.zeros((1, 1), np.float32)},
        "has dtype": {**ref, w: ref[w].astype(np.float16)},
        "NaN or Inf": {**ref, w: np.full_like(ref[w], np.nan)},
    }
    for needle, upd in cases.items():
        why = check_update(upd, ref)
        assert why is not None and needle in why
    inf = {**ref, w: np.full_like(ref[w], np.inf)}
    assert "'0.weight'" in str(check_update(inf, ref))


def test_checksum_and_flatten():
    p = from_torch(bn_model().state_dict())
    q = {k: v.copy() for k, v in p.items()}
    assert checksum(p) == checksum(q)
    q["0.bias"][0] += 1e-3
    assert checksum(p) != checksum(q)
    n_float = sum(v.size for v in p.values() if v.dtype.kind == "f")
    assert flatten(p).shape == (n_float,) and flatten(p).dtype == np.float64


def test_weighted_average_golden_2():
    models = [{"w": np.array([1.0, 2.0], np.float32), "n": np.array(1)},
              {"w": np.array([3.0, 6.0], np.float32), "n": np.array(2)},
              {"w": np.array([5.0, 0.0], np.float32), "n": np.array(3)}]
    out = mean(models, [1, 2, 3])
    # (1*[1,2] + 2*[3,6] + 3*[5,0]) / 6 = [22/6, 14/6]
    np.testing.assert_allclose(out["w"], [22 / 6, 14 / 6], rtol=1e-6)
    assert out["w"].dtype == np.float32
    assert int(out["n"]) == 3  # integer entry from the heaviest model
    scaled = mean(models, [10, 20, 30])
    np.testing.assert_array_equal(scaled["w"], out["w"])
    np.testing.assert_allclose(mean(models, [1, 1, 1])["w"], [3.0, 8 / 3], rtol=1e-6)
    for bad in ([], ):
        with pytest.raises(ValueError):
            mean(bad, [])
    with pytest.raises(ValueError):
        mean(models, [1, 2])
    with pytest.raises(ValueError):
        mean(models, [1, -1, 1])
    with pytest.raises(ValueError):
        mean(models, [0, 0, 0])


def test_fmnist_cnn_is_the_papers_architecture():
    net = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    assert sum(p.numel() for p in net.parameters()) == 582_026
    convs = [m for m in net if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(32, (5, 5)), (64, (5, 5))]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in net) == 2
    fcs = [m for m in net if isinstance(m, torch.nn.Linear)]
    assert [f.out_features for f in fcs] == [512, 10]
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    same = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    other = build_model("fmnist-cnn", (1, 28, 28), 10, seed=1)
    assert torch.equal(net[0].weight, same[0].weight) and not torch.equal(net[0].weight, other[0].weight)


@pytest.mark.parametrize(("name", "shape", "norm"), [
    ("mlp", (1, 8, 8), "bn"), ("cifar-cnn", (3, 32, 32), "bn"),
    ("resnet18", (3, 32, 32), "bn"), ("resnet18", (3, 32, 32), "gn")])
def test_registry_models_run(name, shape, norm):
    net = build_model(name, shape, 10, seed=0, norm=norm).eval()
    assert net(torch.zeros(2, *shape)).shape == (2, 10)
    if name == "resnet18":
        kinds = {type(m) for m in net.modules()}
        assert (torch.nn.GroupNorm in kinds) == (norm == "gn")
        assert (torch.nn.BatchNorm2d in kinds) == (norm == "bn")
    with pytest.raises(KeyError, match="unknown model"):
        build_model("nope", shape, 10, seed=0)


def _idx(path, arr: np.ndarray, magic: int) -> None:
    head = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(head + arr.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_files_are_read_exactly(tmp_path):
    rng = np.random.default_rng(0)
    xtr, xte = rng.integers(0, 256, (5, 28, 28)), rng.integers(0, 256, (3, 28, 28))
    ytr, yte = rng.integers(0, 10, 5), rng.integers(0, 10, 3)
    _idx(tmp_path / "train-images-idx3-ubyte.gz", xtr, 0x803)
    _idx(tmp_path / "t10k-images-idx3-ubyte.gz", xte, 0x803)
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", ytr, 0x801)
    _idx(tmp_path / "t10k-labels-idx1-ubyte.gz", yte, 0x801)
    ds = data.load_fashion_mnist(str(tmp_path))
    assert ds.x_train.shape == (5, 1, 28, 28) and ds.x_train.dtype == torch.uint8
    np.testing.assert_array_equal(ds.x_train[:, 0].numpy(), xtr)
    np.testing.assert_array_equal(ds.y_test.numpy(), yte)
    assert ds.source == str(tmp_path)


def test_truncated_idx_is_a_data_error(tmp_path):
    with gzip.open(tmp_path / "x.gz", "wb") as fh:
        fh.write(struct.pack(">IIII", 0x803, 5, 28, 28) + b"\0" * 100)
    with pytest.raises(data.DataError, match="truncated"):
        data._read_idx(tmp_path / "x.gz")


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "DEBIAN_FMNIST", tmp_path / "absent")
    monkeypatch.setenv("FEDSYS_DATA", str(tmp_path))
    with pytest.raises(data.DataError) as e:
        data.load_fashion_mnist("")
    msg = str(e.value)
    assert "fedsys data fetch fashion-mnist" in msg and "dataset-fashion-mnist" in msg
    assert str(tmp_path) in msg


def test_synthetic_is_fixed_and_learnable_shape():
    a, b = data.make_synthetic(), data.make_synthetic()
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.x_train.shape == (2000, 1, 8, 8) and a.x_train.dtype == torch.uint8
    assert set(a.y_train.unique().tolist()) == set(range(10))


def test_distance_is_l2_over_float_entries_only():
    a = {"w": np.array([[0.0, 3.0]], np.float32), "b": np.array([1.0], np.float64),
         "n": np.array(7, np.int64)}
    b = {"w": np.array([[4.0, 3.0]], np.float32), "b": np.array([1.0], np.float64),
         "n": np.array(9, np.int64)}  # integer buffers are not a direction the model moves
    assert fp.distance(a, b) == 4.0 and fp.distance(b, a) == 4.0
    assert fp.distance(a, a) == 0.0


def test_distance_to_a_flattened_model_is_the_distance_bit_for_bit():
    """:func:`fedsys.params.distance_to` fills one array in place: the same number as
    ``norm(flatten(a) - flatten(b))`` to the bit, integer entries left out, and numpy's
    error where the float entries do not match in size."""
    from fedsys.params import distance, distance_to, flatten

    rng = np.random.default_rng(7)
    for _ in range(20):
        a = {"w": rng.standard_normal((16, 9)).astype(np.float32), "steps": np.arange(3),
             "b": rng.standard_normal(16).astype(np.float32), "h": rng.standard_normal((2, 2))}
        b = {k: v + rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
             for k, v in a.items()}
        want = float(np.linalg.norm(flatten(a) - flatten(b)))
        assert distance_to(a, flatten(b)) == want == distance(a, b)
    with pytest.raises(ValueError):
        distance_to({"w": np.zeros(3, np.float32)}, np.zeros(4))
