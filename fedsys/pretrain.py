"""Pre-trained starts: a held-out split no client and no test ever sees, a model trained
centrally on it with its classifier head re-initialised, saved with its provenance, and
any run started from a saved model (``init-from``).

Local Superior Soups assumes an ImageNet-pretrained start (spec ``lss.md`` §5.1), which
is not available offline; the stand-in keeps what matters: every client starts from the
same useful, non-random feature extractor with a fresh head, fine-tunes everything, and
the pre-training data is disjoint from client and test data.  The held-out split
(``pretrain.holdout`` samples of the training set, class-balanced or from a label subset)
is drawn with a fixed seed, so it is the same for every run seed and method; the
partitions are built on the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedsys.options import ConfigError, option
from fedsys.params import Params, from_torch
from fedsys.seeding import derive_seed, seed_torch

HOLDOUT_SEED = 0x401D
HEAD_TAG = 0x4EAD
FORMAT = "fedsys-pretrained-1"


@dataclass(frozen=True)
class PretrainOptions:
    """``fedsys pretrain``'s keys (``pretrain.*``); the hold-out keys also shape every
    run's partitions (clients never get the held-out samples)."""

    holdout: int = option(0, "Training samples held out from every client for pre-training "
                          "(0: none).  The same split for every seed.", bounds=">= 0")
    split: str = option("balanced", "Held-out samples: balanced (equal per class) or labels "
                        "(only the classes in pretrain.labels, a transfer gap).",
                        choices=("balanced", "labels"))
    labels: str = option("0,1,2,3,4", "Classes held out with split labels (comma-separated).")
    epochs: int = option(2, "Central pre-training epochs.", bounds="> 0")
    lr: float = option(1e-3, "Adam learning rate of pre-training.", bounds="> 0")
    batch_size: int = option(64, "Batch size of pre-training.", bounds="> 0")
    out: str = option("", "Where the model goes (empty: <output-dir>/<name>/pretrained.pt).")


def parse_labels(text: str, num_classes: int) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``, each in ``0..num_classes-1``."""
    try:
        out = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ConfigError(f"config key 'pretrain.labels': {text!r} is not a comma-separated "
                          "list of class ids") from None
    if not out or out[0] < 0 or out[-1] >= num_classes:
        raise ConfigError(f"config key 'pretrain.labels': {text!r} must name classes in "
                          f"0..{num_classes - 1}")
    return out


def holdout_indices(labels: NDArray[np.integer], n: int, split: str,
                    classes: list[int] | None = None) -> NDArray[np.int64]:
    """``n`` training indices held out for pre-training (sorted), drawn with a fixed seed.

    ``balanced``: ``n // C`` per class over all C classes (the remainder from the first
    classes); ``labels``: the same over ``classes`` only.
    """
    y = np.asarray(labels).astype(np.int64)
    pool = sorted(set(y.tolist())) if split == "balanced" else list(classes or [])
    rng = np.random.default_rng(HOLDOUT_SEED)
    out = []
    for i, c in enumerate(pool):
        idx = np.flatnonzero(y == c)
        k = n // len(pool) + (1 if i < n % len(pool) else 0)
        if k > len(idx):
            raise ConfigError(f"config key 'pretrain.holdout': {n} samples need {k} of class "
                              f"{c}, which has {len(idx)}")
        out.append(rng.choice(idx, size=k, replace=False))
    return np.sort(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, np.int64)


def head_name(state: Mapping[str, Any]) -> str:
    """The classifier head: the module of the last 2-d weight (``fc``, ``8`` ...) of a
    state dict (arrays or tensors)."""
    keys = [k for k, v in state.items() if k.endswith(".weight") and v.ndim == 2]
    if not keys:
        raise ValueError("the model has no linear layer (no classifier head)")
    return keys[-1].rsplit(".", 1)[0]


def reinit_head(net: Any, seed: int) -> str:
    """Re-initialise ``net``'s classifier head in place (PyTorch's default init, from
    ``seed``); returns its name."""
    import torch

    name = head_name({k: v.detach().numpy() for k, v in net.state_dict().items()})
    module = net.get_submodule(name)
    with torch.random.fork_rng(devices=[]):
        seed_torch(derive_seed(seed, HEAD_TAG))
        module.reset_parameters()
    return name


def save(path: Path, state: Params, provenance: dict[str, Any]) -> Path:
    """Write a pre-trained model and its provenance (atomically)."""
    import torch

    from fedsys.params import to_torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"format": FORMAT, "state_dict": to_torch(state), "provenance": provenance}, tmp)
    tmp.replace(path)
    return path


def read_state_dict(path: Path, what: str) -> tuple[Params, dict[str, Any]]:
    """The weights in a model file: a ``fedsys pretrain`` file (and its provenance), or a
    plain state dict saved by ``torch.save`` (a run's ``model.pt`` and saved models, a
    torchvision ``.pth``).

    A missing file, one that is truncated or corrupt (a bit flipped since it was written
    included: the CRC-32 of each part of the archive) or one holding no state dict is a
    :class:`ConfigError` starting with ``what`` and naming the file.
    """
    import torch

    from fedsys.checkpoint import changed_part

    if not path.is_file():
        raise ConfigError(f"{what}: no file at {path}")
    if part := changed_part(path):
        raise ConfigError(f"{what}: {path} is corrupt (its part {part!r} fails the CRC-32 it "
                          "was written with)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"{what}: {path} is not a state dict saved by torch.save, or it is "
                          f"truncated or corrupt ({type(exc).__name__})") from None
    prov: dict[str, Any] = {}
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        prov = dict(blob.get("provenance", {}))
        blob = blob["state_dict"]
    if not isinstance(blob, dict) or not all(hasattr(v, "shape") for v in blob.values()):
        raise ConfigError(f"{what}: {path} holds no state dict")
    return from_torch(blob), prov


def load_initial(path: Path, reference: Params, reinit: list[str]) -> tuple[Params, dict[str, Any]]:
    """The start of a run from a saved model: a ``fedsys pretrain`` file or a plain
    state dict (a torchvision ``.pth``), checked against the run's model.

    Entries whose names start with one of ``reinit`` keep the run's fresh values
    (``init-reinit: fc`` for a new head).  A missing or unexpected entry or a shape
    mismatch is a :class:`ConfigError` naming them.
    """
    given, prov = read_state_dict(path, "config key 'init-from'")

    def skip(k: str) -> bool:
        return any(k == r or k.startswith(r + ".") for r in reinit)

    missing = [k for k in reference if k not in given and not skip(k)]
    extra = [k for k in given if k not in reference and not skip(k)]
    shapes = [f"{k} {tuple(given[k].shape)} here {tuple(v.shape)}" for k, v in reference.items()
              if k in given and not skip(k) and given[k].shape != v.shape]
    if missing or extra or shapes:
        parts = [f"missing {missing[:4]}" if missing else "",
                 f"unexpected {extra[:4]}" if extra else "",
                 f"shape {shapes[:3]}" if shapes else ""]
        raise ConfigError(f"config key 'init-from': {path} does not fit the model ("
                          f"{'; '.join(p for p in parts if p)}); list entries to keep fresh in "
                          "'init-reinit' (e.g. fc, conv1)")
    out = {k: (v if skip(k) else given[k].astype(v.dtype)) for k, v in reference.items()}
    return out, prov


__all__ = ["FORMAT", "PretrainOptions", "head_name", "holdout_indices", "load_initial",
           "parse_labels", "read_state_dict", "reinit_head", "save"]
