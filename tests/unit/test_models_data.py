"""Unit tests of fedsys.models (registry, architectures) and fedsys.data (loaders)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsys import data as fdata
from fedsys.models import MODELS, build_model

# -------------------------------------------------------------------------- models


def _n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_registry_names():
    assert {"fmnist-cnn", "cifar-cnn", "resnet18", "mlp"} <= set(MODELS)


def test_blitz_cnn_is_the_template_model_in_its_weights():
    """Flower's app template's CNN (PyTorch's blitz): 62,006 weights on CIFAR's 3x32x32,
    44,426 on Fashion-MNIST's 1x28x28."""
    # conv1 3*6*25+6, conv2 6*16*25+16, fc1 400*120+120, fc2 120*84+84, fc3 84*10+10
    assert _n_params(build_model("blitz-cnn", (3, 32, 32), 10, seed=0)) == \
        456 + 2416 + 48120 + 10164 + 850 == 62006
    net = build_model("blitz-cnn", (1, 28, 28), 10, seed=0)
    assert _n_params(net) == 156 + 2416 + 30840 + 10164 + 850 == 44426
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_fmnist_cnn_parameter_count():
    net = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    # conv1 1*32*25+32 + conv2 32*64*25+64 + fc1 1024*512+512 + fc2 512*10+10
    assert _n_params(net) == 832 + 51264 + 524800 + 5130 == 582026


def test_fmnist_cnn_layers():
    net = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    mods = [m for m in net.modules() if m is not net]
    assert [type(m) for m in mods] == [
        nn.Conv2d,
        nn.ReLU,
        nn.MaxPool2d,
        nn.Conv2d,
        nn.ReLU,
        nn.MaxPool2d,
        nn.Flatten,
        nn.Linear,
        nn.ReLU,
        nn.Linear,
    ]
    conv1, conv2 = mods[0], mods[3]
    assert (conv1.in_channels, conv1.out_channels, conv1.kernel_size) == (1, 32, (5, 5))
    assert (conv2.in_channels, conv2.out_channels, conv2.kernel_size) == (32, 64, (5, 5))
    assert conv1.padding == conv2.padding == (0, 0)
    for pool in (mods[2], mods[5]):
        assert pool.kernel_size == 2
    fc1, fc2 = mods[7], mods[9]
    assert (fc1.in_features, fc1.out_features) == (64 * 4 * 4, 512)
    assert (fc2.in_features, fc2.out_features) == (512, 10)


def test_fmnist_cnn_forward_shape():
    net = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    out = net(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_build_model_seed_determinism():
    a = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    b = build_model("fmnist-cnn", (1, 28, 28), 10, seed=0)
    c = build_model("fmnist-cnn", (1, 28, 28), 10, seed=1)
    assert _same_weights(a, b)
    assert not _same_weights(a, c)


def test_build_model_leaves_global_rng_alone():
    torch.manual_seed(77)
    expected = torch.rand(3)
    torch.manual_seed(77)
    build_model("mlp", (1, 8, 8), 10, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_mlp_forward():
    net = build_model("mlp", (1, 8, 8), 10, seed=0)
    assert net(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert _n_params(net) == 64 * 64 + 64 + 64 * 10 + 10


def test_cifar_cnn_forward():
    net = build_model("cifar-cnn", (3, 32, 32), 10, seed=0)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (64 * 5 * 5, 384),
        (384, 192),
        (192, 10),
    ]


@pytest.mark.parametrize("norm", ["bn", "gn"])
def test_resnet18_forward(norm):
    net = build_model("resnet18", (3, 32, 32), 10, seed=0, norm=norm).eval()
    with torch.no_grad():
        out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    kinds = {type(m) for m in net.modules()}
    if norm == "gn":
        assert nn.GroupNorm in kinds
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
        assert not any(k.endswith("num_batches_tracked") for k in net.state_dict())
    else:
        assert nn.BatchNorm2d in kinds
        assert nn.GroupNorm not in kinds
    # small-image stem: 3x3 conv, no max-pool
    assert net.conv1.kernel_size == (3, 3)
    assert isinstance(net.maxpool, nn.Identity)


def test_unknown_model_raises_key_error():
    with pytest.raises(KeyError, match="nope"):
        build_model("nope", (1, 28, 28), 10, seed=0)


# ----------------------------------------------------------------------- synthetic


def test_make_synthetic_shapes_and_dtypes():
    ds = fdata.make_synthetic()
    assert ds.name == "synthetic"
    assert ds.x_train.shape == (2000, 1, 8, 8)
    assert ds.x_test.shape == (500, 1, 8, 8)
    assert ds.x_train.dtype == torch.uint8 and ds.x_test.dtype == torch.uint8
    assert ds.y_train.dtype == torch.int64 and ds.y_test.dtype == torch.int64
    for y in (ds.y_train, ds.y_test):
        assert int(y.min()) >= 0 and int(y.max()) <= 9
    assert len(torch.unique(ds.y_train)) == 10
    assert ds.num_classes == 10
    assert ds.input_shape == (1, 8, 8)


def test_make_synthetic_deterministic():
    a, b = fdata.make_synthetic(), fdata.make_synthetic()
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = fdata.make_synthetic(seed=99)
    assert not torch.equal(a.x_train, c.x_train)


def test_make_synthetic_sizes():
    ds = fdata.make_synthetic(n_train=30, n_test=20, num_classes=3)
    assert ds.x_train.shape == (30, 1, 8, 8)
    assert ds.y_test.shape == (20,)
    assert int(ds.y_train.max()) <= 2


def test_normalise():
    ds = fdata.make_synthetic(n_train=10, n_test=10)
    x = torch.tensor([0, 255], dtype=torch.uint8).view(2, 1, 1, 1)
    out = ds.normalise(x)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.flatten().numpy(), [(0 - 0.5) / 0.25, (1 - 0.5) / 0.25])


def test_load_dataset_synthetic():
    ds = fdata.load_dataset("synthetic")
    ref = fdata.make_synthetic()
    assert torch.equal(ds.x_train, ref.x_train)
    assert torch.equal(ds.y_test, ref.y_test)


def test_load_dataset_unknown():
    with pytest.raises(fdata.DataError, match="nope"):
        fdata.load_dataset("nope")


# ---------------------------------------------------------------------------- IDX


def _idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    magic = 0x00000800 | arr.ndim  # 0x803 for images, 0x801 for labels
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.tobytes()


def _write_fmnist(directory: Path, n_train: int = 5, n_test: int = 3, gz: bool = True) -> dict:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, size=n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, size=n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for stem, arr in arrays.items():
        raw = _idx_bytes(arr)
        if gz:
            (directory / f"{stem}.gz").write_bytes(gzip.compress(raw))
        else:
            (directory / stem).write_bytes(raw)
    return arrays


def test_idx_header_written_as_specified():
    raw = _idx_bytes(np.zeros((2, 28, 28), dtype=np.uint8))
    assert raw[:16] == bytes.fromhex("00000803000000020000001c0000001c")
    assert _idx_bytes(np.zeros(4, dtype=np.uint8))[:8] == bytes.fromhex("0000080100000004")


@pytest.mark.parametrize("gz", [True, False])
def test_load_fashion_mnist_reads_idx_exactly(tmp_path, gz):
    arrays = _write_fmnist(tmp_path, gz=gz)
    ds = fdata.load_fashion_mnist(str(tmp_path))
    assert ds.name == "fashion-mnist"
    assert ds.num_classes == 10
    assert ds.x_train.shape == (5, 1, 28, 28)
    assert ds.x_test.shape == (3, 1, 28, 28)
    assert ds.x_train.dtype == torch.uint8
    assert ds.y_train.dtype == torch.int64
    np.testing.assert_array_equal(ds.x_train[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.x_test[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y_train.numpy(), arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])
    assert ds.input_shape == (1, 28, 28)
    assert Path(ds.source) == tmp_path


def test_load_fashion_mnist_from_fedsys_data_subdir(tmp_path, monkeypatch):
    arrays = _write_fmnist(tmp_path / "fashion-mnist")
    monkeypatch.setenv("FEDSYS_DATA", str(tmp_path))
    monkeypatch.setattr(fdata, "DEBIAN_FMNIST", tmp_path / "does-not-exist")
    ds = fdata.load_fashion_mnist("")
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_data_dir_searched_before_fedsys_data(tmp_path, monkeypatch):
    _write_fmnist(tmp_path / "a", n_train=4)
    _write_fmnist(tmp_path / "b", n_train=6)
    monkeypatch.setenv("FEDSYS_DATA", str(tmp_path / "b"))
    assert fdata.load_fashion_mnist(str(tmp_path / "a")).x_train.shape[0] == 4
    assert fdata.load_fashion_mnist("").x_train.shape[0] == 6


def test_missing_fashion_mnist_explains_how_to_get_it(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FEDSYS_DATA", str(empty))
    monkeypatch.setattr(fdata, "DEBIAN_FMNIST", tmp_path / "no-such-dir")
    with pytest.raises(fdata.DataError) as exc:
        fdata.load_fashion_mnist("")
    msg = str(exc.value)
    assert "fedsys data fetch fashion-mnist" in msg
    assert "dataset-fashion-mnist" in msg
    assert str(empty) in msg  # the searched directories are listed


def test_incomplete_fashion_mnist_dir_is_not_used(tmp_path, monkeypatch):
    _write_fmnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.delenv("FEDSYS_DATA", raising=False)
    monkeypatch.setattr(fdata, "DEBIAN_FMNIST", tmp_path / "no-such-dir")
    with pytest.raises(fdata.DataError, match="not found"):
        fdata.load_fashion_mnist(str(tmp_path))


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_idx_raises_data_error(tmp_path, monkeypatch, gz):
    _write_fmnist(tmp_path, gz=gz)
    stem = "train-images-idx3-ubyte"
    raw = _idx_bytes(np.zeros((5, 28, 28), dtype=np.uint8))[:-100]  # header intact, data short
    path = tmp_path / (f"{stem}.gz" if gz else stem)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    monkeypatch.setattr(fdata, "DEBIAN_FMNIST", tmp_path / "no-such-dir")
    with pytest.raises(fdata.DataError, match="truncated"):
        fdata.load_fashion_mnist(str(tmp_path))


# Known bug (reported, not fixed here): _read_idx only detects a short data section.
# A file cut inside its header, an empty file, or a .gz whose stream was cut off (an
# interrupted download) is a DataError naming the file, not a bare traceback.
@pytest.mark.parametrize("cut", ["header", "empty", "gzip-stream"])
def test_truncated_idx_header_or_stream_raises_data_error(tmp_path, monkeypatch, cut):
    _write_fmnist(tmp_path, gz=True)
    full = _idx_bytes(np.zeros((5, 28, 28), dtype=np.uint8))
    blob = {
        "header": gzip.compress(full[:10]),
        "empty": gzip.compress(b""),
        "gzip-stream": gzip.compress(full)[:-30],
    }[cut]
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(blob)
    monkeypatch.setattr(fdata, "DEBIAN_FMNIST", tmp_path / "no-such-dir")
    with pytest.raises(fdata.DataError):
        fdata.load_fashion_mnist(str(tmp_path))


def test_a_data_dir_without_the_data_is_an_error_naming_it(tmp_path, monkeypatch):
    """Issue 41: only an empty data-dir searches the defaults; a given one is the data."""
    _write_fmnist(tmp_path / "elsewhere", n_train=6)
    monkeypatch.setenv("FEDSYS_DATA", str(tmp_path / "elsewhere"))
    (tmp_path / "empty").mkdir()
    for given in (tmp_path / "empty", tmp_path / "nonexistent"):
        with pytest.raises(fdata.DataError, match=f"not found in data-dir {given}:"):
            fdata.load_fashion_mnist(str(given))
    assert fdata.load_fashion_mnist("").x_train.shape[0] == 6
    fdata.load_dataset.cache_clear()
    with pytest.raises(fdata.DataError, match=f"data-dir {tmp_path / 'nonexistent'} is not a dir"):
        fdata.load_dataset("synthetic", str(tmp_path / "nonexistent"))
    assert fdata.load_dataset("synthetic", str(tmp_path / "empty")).num_classes > 0
    fdata.load_dataset.cache_clear()


def test_a_gz_is_read_through_an_uncompressed_copy_made_once(tmp_path, monkeypatch):
    """The first load decompresses and keeps a copy in $FEDSYS_CACHE; later loads read the
    copy (the same arrays); a copy cut short is made again; a changed file gets a new copy;
    without a writable cache the .gz is read every time."""
    monkeypatch.setenv("FEDSYS_CACHE", str(tmp_path / "cache"))
    arrays = _write_fmnist(tmp_path / "data")
    first = fdata.load_fashion_mnist(str(tmp_path / "data"))
    copies = sorted((tmp_path / "cache" / "idx").iterdir())
    assert len(copies) == 4 and all(not c.name.startswith(".") for c in copies)
    images = fdata.idx_cache(tmp_path / "data" / "train-images-idx3-ubyte.gz")
    assert images in copies and images.read_bytes() == _idx_bytes(arrays["train-images-idx3-ubyte"])
    images.write_bytes(images.read_bytes()[:100])  # cut short: not used, made again
    again = fdata.load_fashion_mnist(str(tmp_path / "data"))
    assert torch.equal(again.x_train, first.x_train) and torch.equal(again.y_test, first.y_test)
    assert images.read_bytes() == _idx_bytes(arrays["train-images-idx3-ubyte"])
    changed = _write_fmnist(tmp_path / "data", n_train=7)  # new size: a new copy
    assert fdata.load_fashion_mnist(str(tmp_path / "data")).x_train.shape[0] == 7
    np.testing.assert_array_equal(fdata.load_fashion_mnist(str(tmp_path / "data")).x_train[:, 0].numpy(),
                                  changed["train-images-idx3-ubyte"])
    (tmp_path / "blocked").write_text("a file where the cache directory would be")
    monkeypatch.setenv("FEDSYS_CACHE", str(tmp_path / "blocked"))
    assert fdata.load_fashion_mnist(str(tmp_path / "data")).x_train.shape[0] == 7


def test_normaliser_works_on_the_batch_device() -> None:
    import torch

    from fedsys.data import Normaliser

    norm = Normaliser((0.5,), (0.25,))
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    assert torch.equal(norm(x), torch.tensor([[[[-2.0, 2.0]]]]))
    out = norm(x.to("meta"))  # a batch elsewhere than the CPU stays there
    assert out.device.type == "meta" and out.dtype == torch.float32 and out.shape == x.shape
