"""Parameter conversion, update checks, FedAvg maths, the model registry, the data loaders."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from fedsys import data as data
from fedsys import protocol
from fedsys.models import build_model
from fedsys.params import check_update, checksum, flatten, from_torch, mean, to_torch


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


def test_weighted_average_golden():
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
