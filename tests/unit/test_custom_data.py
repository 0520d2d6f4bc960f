"""A dataset of the user's own (``dataset: custom``, ``data-dir``): NumPy files or class
folders, read, checked and partitioned like the built-in ones, and what is wrong with them
named (fedsys/data.py ``load_custom``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsys.data import DataError, load_custom, load_dataset
from fedsys.partition import dirichlet
from fedsys_launch.commands.cli import main


def _npz(root: Path, n_train: int = 60, n_test: int = 20, shape: tuple[int, ...] = (8, 8),
         classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable dataset written as train.npz / test.npz: class prototypes plus noise."""
    rng = np.random.default_rng(seed)
    protos = rng.uniform(30, 220, size=(classes, *shape))
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for part, n in (("train", n_train), ("test", n_test)):
        y = np.arange(n) % classes
        x = np.clip(protos[y] + rng.normal(0, 20, size=(n, *shape)), 0, 255).astype(np.uint8)
        np.savez(root / f"{part}.npz", x=x, y=y)
        out.append((x, y))
    return out[0]


def test_a_numpy_pair_is_read_as_uint8_nchw_with_its_own_normalisation(tmp_path):
    x, y = _npz(tmp_path / "gray", shape=(8, 8))
    ds = load_custom(str(tmp_path / "gray"))
    assert (ds.name, ds.num_classes, ds.input_shape) == ("custom", 3, (1, 8, 8))
    assert ds.x_train.dtype == torch.uint8 and torch.equal(ds.x_train[:, 0], torch.from_numpy(x))
    assert torch.equal(ds.y_train, torch.from_numpy(y).long()) and len(ds.y_test) == 20
    assert ds.mean[0] == pytest.approx(x.mean() / 255) and ds.std[0] == pytest.approx(x.std() / 255)
    norm = ds.normalise(ds.x_train).to(torch.float64)
    assert float(norm.mean()) == pytest.approx(0, abs=1e-5)
    assert float(norm.std()) == pytest.approx(1, rel=1e-2)
    # colour images channels-last become channels-first
    xc, _ = _npz(tmp_path / "rgb", shape=(6, 5, 3))
    rgb = load_custom(str(tmp_path / "rgb"))
    assert rgb.input_shape == (3, 6, 5)
    assert torch.equal(rgb.x_train, torch.from_numpy(xc.transpose(0, 3, 1, 2).copy()))
    assert len(rgb.mean) == len(rgb.std) == 3


def test_class_folders_are_read_in_sorted_class_order(tmp_path):
    for part, n in (("train", 3), ("test", 1)):
        for k, name in enumerate(["cat", "ant", "bee"]):
            (tmp_path / part / name).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(np.full((5, 7), 40 * k + i, np.uint8), "L").save(
                    tmp_path / part / name / f"{i}.png")
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    ds = load_custom(str(tmp_path))
    assert ds.num_classes == 3 and ds.input_shape == (1, 5, 7)
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # ant, bee, cat
    assert ds.x_train[:, 0, 0, 0].tolist() == [40, 41, 42, 80, 81, 82, 0, 1, 2]
    assert ds.y_test.tolist() == [0, 1, 2]
    # one image of another size is named
    Image.fromarray(np.zeros((6, 7), np.uint8), "L").save(tmp_path / "test" / "bee" / "big.png")
    load_dataset.cache_clear()
    with pytest.raises(DataError, match=r"big\.png is 1x6x7 .* images before it are 1x5x7"):
        load_custom(str(tmp_path))
    (tmp_path / "test" / "bee" / "big.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"big\.png is not a readable image"):
        load_custom(str(tmp_path))


@pytest.mark.parametrize(("spoil", "says"), [
    (lambda d: (d / "test.npz").unlink(), r"test\.npz is missing: dataset custom reads"),
    (lambda d: np.savez(d / "train.npz", images=np.zeros((4, 8, 8), np.uint8)),
     r"train\.npz holds \['images'\], not the arrays 'x' and 'y'"),
    (lambda d: np.savez(d / "train.npz", x=np.zeros((4, 8, 8)), y=np.zeros(4, int)),
     r"'x' is float64; give uint8 pixel values 0..255"),
    (lambda d: np.savez(d / "train.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.zeros(3, int)),
     r"'y' must be one integer label per image \(4\)"),
    (lambda d: np.savez(d / "test.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.full(4, 7)),
     r"a test label is 7 but the training part has classes 0..2"),
    (lambda d: np.savez(d / "test.npz", x=np.zeros((4, 9, 8), np.uint8), y=np.zeros(4, int)),
     r"training images are 1x8x8 but test images 1x9x8"),
    (lambda d: np.savez(d / "train.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.array([0, -1, 1, 2])),
     r"a label is -1"),
    (lambda d: (d / "train.npz").write_bytes(b"garbage"), r"train\.npz is not a readable \.npz"),
    (lambda d: [p.unlink() for p in d.glob("*.npz")], r"holds neither train\.npz and test\.npz nor"),
])
def test_what_is_wrong_with_a_dataset_is_named(tmp_path, spoil, says):
    _npz(tmp_path)
    spoil(tmp_path)
    with pytest.raises(DataError, match=says):
        load_custom(str(tmp_path))


def test_an_empty_or_missing_data_dir_says_how(tmp_path):
    with pytest.raises(DataError, match="data-dir is empty: dataset custom reads"):
        load_custom("")
    with pytest.raises(DataError, match="is not a directory: dataset custom reads"):
        load_custom(str(tmp_path / "nowhere"))


def test_it_is_partitioned_like_the_built_in_datasets(tmp_path):
    """Dirichlet over its labels: every sample once, the clients' label mixes skewed."""
    _npz(tmp_path, n_train=600, classes=5)
    ds = load_custom(str(tmp_path))
    parts = dirichlet(ds.y_train.numpy(), 6, seed=1, alpha=0.3)
    flat = np.sort(np.concatenate(parts))
    assert np.array_equal(flat, np.arange(600))
    assert len({tuple(np.bincount(ds.y_train.numpy()[p], minlength=5)) for p in parts}) == 6


def test_fedsys_run_trains_on_a_dataset_of_ones_own(tmp_path, capsys):
    """As a user: the data checked by ``fedsys data fetch custom``, then a run on it."""
    data = tmp_path / "mydata"
    _npz(data, n_train=400, n_test=100, shape=(8, 8), classes=4)
    assert main(["data", "fetch", "custom", "--data-dir", str(data)]) == 0
    assert (f"custom is available in {data}: 400 training and 100 test images of 1x8x8 "
            "(channels x height x width), 4 classes") in capsys.readouterr().out
    assert main(["run", "--set", "dataset=custom", "--set", f"data-dir={data}", "--set", "model=mlp",
                 "--set", "num-clients=4", "--set", "clients-per-round=4", "--set", "strategy=fedavg",
                 "--set", "num-server-rounds=3", "--set", "partition=dirichlet",
                 "--set", "engine=inprocess", "--set", "lr=0.05",
                 "--set", f"output-dir={tmp_path}", "--set", "name=mine"]) == 0
    from fedsys import metrics

    rows = metrics.read_jsonl(tmp_path / "mine" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["accuracy"] > 0.6  # 4 well-separated classes: chance is 0.25
    assert main(["run", "--set", "dataset=custom", "--set", "num-server-rounds=1"]) == 2
    assert "data-dir is empty: dataset custom reads a dataset of your own" in capsys.readouterr().err
