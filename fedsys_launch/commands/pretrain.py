"""``fedsys pretrain CONFIG``: train the config's model centrally on the held-out split
(``pretrain.*``), re-initialise its classifier head, save it with its provenance.

A run starts from it with ``init-from: PATH``; that run must hold out the same samples
(its ``pretrain.holdout``, ``pretrain.split`` and ``pretrain.labels``), so no client ever
trains on what the model was pre-trained on (checked when the run starts).
"""

from __future__ import annotations

import argparse
import hashlib
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from fedsys.config import ConfigError, RunConfig
from fedsys_launch import config_schema


def pretrain(cfg: RunConfig) -> Path:
    """Pre-train, reset the head, save; returns the file written."""
    import torch

    from clients.optim import Optimiser
    from fedsys import pretrain as pt
    from fedsys.params import from_torch
    from fedsys.seeding import derive_seed
    from fedsys.task import dataset, evaluate, holdout, model, pick_device, test_sets

    idx = holdout(cfg)
    if len(idx) == 0:
        raise ConfigError("config key 'pretrain.holdout' is 0: set how many training samples "
                          "to hold out for pre-training (e.g. --set pretrain.holdout=6000)")
    ds = dataset(cfg)
    net = model(cfg, ds)
    device = pick_device(cfg.device)
    net.to(device)
    epochs, bs = int(cfg.get("pretrain.epochs")), int(cfg.get("pretrain.batch-size"))
    opt = Optimiser(net.parameters(), "adam", float(cfg.get("pretrain.lr")))
    x, y = ds.x_train[torch.from_numpy(idx)], ds.y_train[torch.from_numpy(idx)]
    gen = torch.Generator().manual_seed(derive_seed(cfg.seed, 0x9E7))
    sets = test_sets(cfg)
    t0 = time.time()
    acc = 0.0
    for epoch in range(1, epochs + 1):
        net.train()
        perm = torch.randperm(len(y), generator=gen)
        loss_sum = 0.0
        for i in range(0, len(y), bs):
            b = perm[i : i + bs]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(ds.normalise(x[b]).to(device)), y[b].to(device))
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * len(b)
        accs = [evaluate(net, ds, xs, ys, cfg.eval_batch_size, device)[1] for _, xs, ys in sets]
        acc = sum(accs) / len(accs)
        print(f"pretrain: epoch {epoch}/{epochs} | train loss {loss_sum / len(y):.4f} | "
              f"test accuracy {acc:.4f} | {time.time() - t0:.0f} s", flush=True)
    head = pt.reinit_head(net.cpu(), cfg.seed)
    out = Path(str(cfg.get("pretrain.out")) or cfg.run_dir / "pretrained.pt").expanduser()
    try:
        version = metadata.version("fedsys")
    except metadata.PackageNotFoundError:
        version = "unknown"
    provenance: dict[str, Any] = {
        "config": cfg.to_dict(), "dataset": cfg.dataset, "model": cfg.model, "seed": cfg.seed,
        "holdout": {"samples": len(idx), "split": str(cfg.get("pretrain.split")),
                    "labels": str(cfg.get("pretrain.labels")),
                    "indices-sha256": hashlib.sha256(idx.tobytes()).hexdigest()},
        "epochs": epochs, "lr": float(cfg.get("pretrain.lr")), "batch-size": bs,
        "test-accuracy-before-head-reset": acc, "head-reinitialised": head,
        "fedsys": version,
    }
    pt.save(out, from_torch(net.state_dict()), provenance)
    print(f"pretrain: {cfg.model} on {len(idx)} held-out samples ({provenance['holdout']['split']}"
          f"), test accuracy {acc:.4f} before its head '{head}' was re-initialised\n"
          f"saved: {out}\nstart a run from it: --set init-from={out} (holding out the same "
          f"samples: pretrain.holdout={len(idx)})")
    return out


def cmd_pretrain(args: argparse.Namespace) -> int:
    """``fedsys pretrain``."""
    cfg = config_schema.load(Path(args.config) if args.config else None, args.set or [])
    pretrain(cfg)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``fedsys pretrain``."""
    p = sub.add_parser(
        "pretrain", help="pre-train the config's model on a held-out split (a pre-trained start)",
        description="Train the config's model centrally on pretrain.holdout training samples "
        "that no client and no test ever sees (class-balanced, or only the classes of "
        "pretrain.labels), re-initialise its classifier head, and save it with its provenance "
        "(config, held-out split, seed, accuracy). Runs start from it with init-from.")
    p.add_argument("config", nargs="?", help="YAML config")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key")
    p.set_defaults(fn=cmd_pretrain)


__all__ = ["add_parser", "cmd_pretrain", "pretrain"]
