"""``fedsys landscape``: loss and error over the plane through three models, or along
the line between two (IMA spec ``fedima.md`` §3.1-3.2), as PNG and JSON.

Models come from a run directory (``save-models: global`` keeps every round's global
model under ``<run>/<strategy>/models/``) or from ``.pt`` state-dict files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedsys import config as cfgmod
from fedsys import metrics
from fedsys.landscape import (
    contour_levels,
    interpolate,
    plane_basis,
    plane_grid,
    plane_point,
)
from fedsys.params import Params, check_update, flatten, from_torch, to_torch, unflatten
from fedsys.pretrain import read_state_dict
from fedsys_launch import config_schema


def add_parser(sub: Any) -> None:
    """Register ``fedsys landscape``."""
    p = sub.add_parser(
        "landscape",
        help="loss/error over the plane through three models (or the line between two)",
        description="Evaluate test (or train) loss and error on a grid over the plane through "
        "three models (Gram-Schmidt basis, bounding box plus margins) and draw filled "
        "contours with the models and their average marked; or along the line between two "
        "models. Models: the last three (two) saved global models of a run "
        "(save-models: global), chosen rounds, or .pt files.",
    )
    p.add_argument("run_dir", nargs="?", help="run directory (with save-models: global)")
    p.add_argument("--strategy", help="strategy label inside the run (default: the first)")
    p.add_argument("--rounds", type=int, nargs="+", help="rounds whose global models to use")
    p.add_argument("--models", nargs="+", help=".pt state dicts instead of a run directory")
    p.add_argument("--config", help="YAML config for --models (dataset, model, seed)")
    p.add_argument("--line", action="store_true", help="1-D interpolation between two models")
    p.add_argument("--grid", type=int, default=21, help="grid points per axis (default 21)")
    p.add_argument("--margin", type=float, default=0.25, help="margin per side, fraction of the box")
    p.add_argument("--split", choices=("test", "train"), default="test")
    p.add_argument("--test-subset", type=int, default=2000,
                   help="evaluate on the first n samples of the split (0 = all); a plane costs "
                   "grid^2 evaluations")
    p.add_argument("--out", help="output PNG (default: <run>/<strategy>/landscape.png)")
    p.set_defaults(fn=cmd_landscape)


def _models(args: argparse.Namespace) -> tuple[list[Params], list[str], cfgmod.RunConfig, Path]:
    want = 2 if args.line else 3
    if args.models:
        if len(args.models) != want:
            raise cfgmod.ConfigError(f"--models needs exactly {want} files")
        paths = [Path(m) for m in args.models]
        cfg = config_schema.load(Path(args.config) if args.config else None)
        out = paths[0].parent
    else:
        if not args.run_dir:
            raise cfgmod.ConfigError("give a run directory or --models")
        run = Path(args.run_dir)
        if not (run / "config.yaml").exists():
            raise cfgmod.ConfigError(f"{run} is not a fedsys run directory (no config.yaml)")
        cfg = config_schema.load(run / "config.yaml")
        label = args.strategy or cfg.strategies[0]
        mdir = run / label / "models"
        saved = sorted(mdir.glob("global-r*.pt"))
        if not saved:
            raise cfgmod.ConfigError(
                f"no saved global models in {mdir}; run with 'save-models: global'")
        by_round = {int(p.stem.split("-r")[1]): p for p in saved}
        rounds = args.rounds or sorted(by_round)[-want:]
        missing = [r for r in rounds if r not in by_round]
        if missing or len(rounds) != want:
            raise cfgmod.ConfigError(
                f"need {want} saved rounds; missing {missing}, saved {sorted(by_round)[:5]}...")
        paths = [by_round[r] for r in rounds]
        out = run / label
    models = [read_state_dict(p, "fedsys landscape")[0] for p in paths]
    for p, m in zip(paths[1:], models[1:], strict=True):
        if why := check_update(m, models[0]):
            raise cfgmod.ConfigError(f"fedsys landscape: {p} is not the same model as {paths[0]}: {why}")
    return models, [p.stem for p in paths], cfg, out


def cmd_landscape(args: argparse.Namespace) -> int:
    """``fedsys landscape``: loss and error over the plane (or line) through saved models."""
    from rich.progress import Progress

    from fedsys.task import dataset, evaluate, model, pick_device

    models, names, cfg, out_dir = _models(args)
    vecs = [flatten(m) for m in models]
    if not args.line:  # before the data is read: the three models must span a plane
        try:
            plane = plane_basis(*vecs)
        except ValueError as exc:
            raise cfgmod.ConfigError(f"{', '.join(names)}: {exc}") from None
    ds = dataset(cfg)
    x, y = (ds.x_test, ds.y_test) if args.split == "test" else (ds.x_train, ds.y_train)
    if args.test_subset:
        x, y = x[: args.test_subset], y[: args.test_subset]
    net = model(cfg, ds)
    like = models[0]
    if why := check_update(like, from_torch(net.state_dict())):
        raise cfgmod.ConfigError(f"fedsys landscape: {', '.join(names)} do not fit the model "
                                 f"{cfg.model!r} on {cfg.dataset} of the config ({why}); give "
                                 "--config with the run's config.yaml")
    device = pick_device(cfg.device)

    def loss_err(vec: np.ndarray) -> tuple[float, float]:
        net.load_state_dict(to_torch(unflatten(vec, like)))
        loss, acc = evaluate(net, ds, x, y, cfg.eval_batch_size, device)
        return loss, 100.0 * (1.0 - acc)

    out = Path(args.out) if args.out else out_dir / ("line.png" if args.line else "landscape.png")
    plt = metrics.pyplot()
    from matplotlib.colors import BoundaryNorm

    if args.line:
        lams = np.round(np.arange(-0.5, 1.5001, 0.05), 4)
        res = []
        with Progress() as bar:
            task = bar.add_task("line", total=len(lams))
            for v in interpolate(vecs[0], vecs[1], lams.tolist()):
                res.append(loss_err(v))
                bar.advance(task)
        loss, err = (np.array(c) for c in zip(*res, strict=True))
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
        ax[0].plot(lams, loss)
        ax[1].plot(lams, err)
        for a, t in zip(ax, (f"{args.split} loss", f"{args.split} error %"), strict=True):
            a.axvline(0, color="k", lw=0.6)
            a.axvline(1, color="k", lw=0.6)
            a.set_xlabel(f"lambda: (1-l) {names[0]} + l {names[1]}")
            a.set_title(t)
        data: dict[str, Any] = {"lambda": lams.tolist(), "loss": loss.tolist(), "error": err.tolist()}
    else:
        gx, gy = plane_grid(plane, args.grid, args.margin)
        loss = np.zeros((len(gy), len(gx)))
        err = np.zeros_like(loss)
        with Progress() as bar:
            task = bar.add_task(f"plane {args.grid}x{args.grid}", total=loss.size)
            for j, yy in enumerate(gy):
                for i, xx in enumerate(gx):
                    loss[j, i], err[j, i] = loss_err(plane_point(plane, float(xx), float(yy)))
                    bar.advance(task)
        fig, ax = plt.subplots(1, 2, figsize=(11, 4.6))
        for a, vals, vmax, la, t in ((ax[0], loss, 5.0, -5.0, f"{args.split} loss"),
                                     (ax[1], err, 40.0, -1.0, f"{args.split} error %")):
            levels = np.unique(contour_levels(vals, vmax, la)[:-1])  # drop the 1e10 cap
            norm = BoundaryNorm(levels, 256)
            c = np.minimum(vals, vmax)
            cs = a.contourf(gx, gy, c, levels=levels, cmap="jet_r", norm=norm, alpha=0.55)
            a.contour(gx, gy, c, levels=levels, cmap="jet_r", norm=norm, linewidths=0.8)
            fig.colorbar(cs, ax=a, format="%.3g")
            for (px, py), n in zip(plane.coords, names, strict=True):
                a.plot(px, py, "k^", ms=8)
                a.annotate(n, (px, py), fontsize=7, xytext=(3, 3), textcoords="offset points")
            a.plot(*plane.centroid, "wX", ms=10, mec="k", label="plain average of the three")
            a.set_title(t)
            a.legend(loc="lower right", fontsize=7)
        data = {"x": gx.tolist(), "y": gy.tolist(), "loss": loss.tolist(), "error": err.tolist(),
                "models": dict(zip(names, plane.coords, strict=True)), "average": plane.centroid}
    metrics.save_figure(fig, out, dpi=120)
    out.with_suffix(".json").write_text(json.dumps(data))
    print(f"landscape: {out} (values in {out.with_suffix('.json')})")
    return 0
