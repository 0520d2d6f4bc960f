"""Landscape geometry (IMA spec §3.1-3.2): the plane's basis is orthonormal and puts the
three models at their stated coordinates; lines, grids, levels and the CLI's errors."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedsys import landscape as ls
from fedsys.params import flatten, unflatten
from fedsys_launch.commands.cli import main

RNG = np.random.default_rng(11)


def test_plane_basis_is_orthonormal_and_places_the_models() -> None:
    t1, t2, t3 = (RNG.normal(size=500) for _ in range(3))
    p = ls.plane_basis(t1, t2, t3)
    assert p.u @ p.u == pytest.approx(1.0) and p.v @ p.v == pytest.approx(1.0)
    assert p.u @ p.v == pytest.approx(0.0, abs=1e-12)
    for (x, y), t in zip(p.coords, (t1, t2, t3), strict=True):
        np.testing.assert_allclose(ls.plane_point(p, x, y), t, atol=1e-10)
    assert p.coords[0] == (0.0, 0.0) and p.coords[1][1] == 0.0
    assert p.coords[1][0] == pytest.approx(np.linalg.norm(t2 - t1))
    cx, cy = p.centroid
    np.testing.assert_allclose(ls.plane_point(p, cx, cy), (t1 + t2 + t3) / 3, atol=1e-10)


def test_degenerate_planes_are_refused() -> None:
    a, b = RNG.normal(size=10), RNG.normal(size=10)
    with pytest.raises(ValueError, match="identical"):
        ls.plane_basis(a, a, b)
    with pytest.raises(ValueError, match="collinear"):
        ls.plane_basis(a, b, 2 * b - a)


def test_grid_covers_the_models_with_margins() -> None:
    p = ls.plane_basis(*(RNG.normal(size=20) for _ in range(3)))
    gx, gy = ls.plane_grid(p, size=21, margin=0.25)
    assert len(gx) == len(gy) == 21
    for x, y in p.coords:  # strictly inside: the margins are positive
        assert gx[0] < x < gx[-1]
        assert gy[0] < y < gy[-1]


def test_interpolation_endpoints_and_midpoint() -> None:
    a, b = RNG.normal(size=7), RNG.normal(size=7)
    pts = ls.interpolate(a, b, [0.0, 0.5, 1.0, 1.5])
    np.testing.assert_allclose(pts[0], a)
    np.testing.assert_allclose(pts[1], (a + b) / 2)
    np.testing.assert_allclose(pts[2], b)
    np.testing.assert_allclose(pts[3], b + 0.5 * (b - a))


def test_vector_round_trip_keeps_dtypes_and_integers() -> None:
    m = {"w": RNG.normal(size=(2, 3)).astype(np.float32), "n": np.array(4, np.int64),
         "b": RNG.normal(size=2).astype(np.float32)}
    v = flatten(m)
    assert v.dtype == np.float64 and v.size == 8
    back = unflatten(v, m)
    assert list(back) == list(m) and back["n"] == 4 and back["w"].dtype == np.float32
    np.testing.assert_array_equal(back["w"], m["w"])


def test_contour_levels_increase_from_min_to_max() -> None:
    vals = RNG.uniform(0.3, 9.0, size=(5, 5))
    lv = ls.contour_levels(vals, vmax=5.0, log_alpha=-5.0)
    assert lv[0] == pytest.approx(vals.min()) and lv[-2] == pytest.approx(5.0) and lv[-1] == 1e10
    assert np.all(np.diff(lv) > 0)


def test_distances() -> None:
    g = {"w": np.zeros(3, np.float32)}
    mx, mean = ls.distances([{"w": np.array([3, 4, 0], np.float32)}, {"w": np.ones(3, np.float32)}], g)
    assert mx == pytest.approx(5.0) and mean == pytest.approx((5 + np.sqrt(3)) / 2)


def test_landscape_cli_says_what_is_missing(tmp_path, capsys) -> None:
    (tmp_path / "config.yaml").write_text("strategy: fedavg\ndataset: synthetic\nmodel: mlp\n")
    assert main(["landscape", str(tmp_path)]) == 2
    assert "save-models: global" in capsys.readouterr().err
    assert main(["landscape", "--models", "a.pt"]) == 2
    assert "exactly 3" in capsys.readouterr().err


def test_landscape_cli_refuses_models_that_span_no_plane(tmp_path, capsys) -> None:
    import torch

    cfg = tmp_path / "c.yaml"
    cfg.write_text("strategy: fedavg\ndataset: synthetic\nmodel: mlp\n")
    w = {"w": torch.ones(3, 2), "b": torch.zeros(2)}
    files = []
    for i, scale in enumerate((1.0, 1.0, 2.0)):
        files.append(str(tmp_path / f"m{i}.pt"))
        torch.save({k: scale * v for k, v in w.items()}, files[-1])
    assert main(["landscape", "--models", *files, "--config", str(cfg)]) == 2
    assert "m0, m1, m2: the first two models are identical: no plane" in capsys.readouterr().err
    torch.save({k: 3.0 * v for k, v in w.items()}, files[1])  # m0, m1, m2 on one line
    assert main(["landscape", "--models", *files, "--config", str(cfg)]) == 2
    assert "collinear" in capsys.readouterr().err


def test_landscape_cli_names_a_broken_or_foreign_model_file(tmp_path, capsys) -> None:
    """A truncated file, a bit flipped since it was written, models of different shapes,
    and models that do not fit the config's model: one line each, no traceback."""
    import torch

    cfg = tmp_path / "c.yaml"
    cfg.write_text("strategy: fedavg\ndataset: synthetic\nmodel: mlp\n")
    files = [str(tmp_path / f"m{i}.pt") for i in range(3)]
    gen = torch.Generator().manual_seed(0)
    for f in files:
        torch.save({"w": torch.randn(3, 2, generator=gen), "b": torch.randn(2, generator=gen)}, f)
    whole = Path(files[1]).read_bytes()

    def refused(expect: str) -> None:
        assert main(["landscape", "--models", *files, "--config", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert expect in err and "Traceback" not in err, err

    Path(files[1]).write_bytes(whole[:100])
    refused(f"fedsys landscape: {files[1]} is not a state dict saved by torch.save, or it is "
            "truncated or corrupt")
    with zipfile.ZipFile(io.BytesIO(whole)) as z:  # the weights of 'w': the part data/0
        part = z.getinfo(next(n for n in z.namelist() if n.endswith("data/0")))
    flipped = bytearray(whole)
    n, extra = struct.unpack("<HH", whole[part.header_offset + 26:part.header_offset + 30])
    flipped[part.header_offset + 30 + n + extra + 5] ^= 0x01  # one bit of one weight
    Path(files[1]).write_bytes(bytes(flipped))
    refused(f"fedsys landscape: {files[1]} is corrupt (its part ")
    torch.save({"w": torch.ones(4, 2), "b": torch.ones(2)}, files[1])
    refused(f"fedsys landscape: {files[1]} is not the same model as {files[0]}: array 'w' has "
            "shape (4, 2), expected (3, 2)")
    torch.save({"w": torch.ones(3, 2), "b": torch.ones(2)}, files[1])
    refused("fedsys landscape: m0, m1, m2 do not fit the model 'mlp' on synthetic of the config "
            "(missing arrays")
