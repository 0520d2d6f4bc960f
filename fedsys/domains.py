"""A domain-shift federation from one image dataset (``partition: domain``).

FedELMY's domain-shift experiments use PACS and Office-Caltech-10, one domain per
client (spec ``fedelmy.md`` §4), which are not available offline.  The stand-in:
the samples are split IID, and every client sees its share through a fixed, seeded
input transform, its "domain": client ``k`` gets kind ``KINDS[k % 4]`` (rotation,
inversion, blur, contrast) with parameters drawn from ``(seed, k)``.  The test set is
scored once per domain and as their union.  Pure tensor functions on ``uint8``
images ``(n, C, H, W)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsys.metrics import pyplot, save_figure
from fedsys.seeding import derive_seed

KINDS = ("rotate", "invert", "blur", "contrast")
DOMAIN_TAG = 0xD0A1


@dataclass(frozen=True)
class Domain:
    """One client's input transform."""

    client: int
    kind: str
    value: float

    @property
    def label(self) -> str:
        """``rotate 270``, ``invert``, ``blur 1.2``, ``contrast 0.35``."""
        if self.kind == "invert":
            return "invert"
        v = int(self.value) if self.kind == "rotate" else round(self.value, 2)
        return f"{self.kind} {v}"


def domain_of(client: int, seed: int) -> Domain:
    """The domain of ``client``: kind by index, parameter from ``(seed, client)``."""
    kind = KINDS[client % len(KINDS)]
    rng = np.random.default_rng(derive_seed(seed, client, DOMAIN_TAG))
    value = {
        "rotate": float(90 * rng.integers(1, 4)),   # 90, 180 or 270 degrees
        "invert": 0.0,
        "blur": float(rng.uniform(0.8, 1.6)),         # Gaussian sigma in pixels
        "contrast": float(rng.uniform(0.25, 0.5)),    # scale of the deviation from mid-grey
    }[kind]
    return Domain(client, kind, value)


def _gaussian(x: torch.Tensor, sigma: float) -> torch.Tensor:
    r = max(1, round(2 * sigma))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    k1 = torch.exp(-(t**2) / (2 * sigma**2))
    k1 = k1 / k1.sum()
    c = x.shape[1]
    xf = x.float()
    xf = torch.nn.functional.conv2d(torch.nn.functional.pad(xf, (r, r, 0, 0), mode="replicate"),
                                    k1.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    xf = torch.nn.functional.conv2d(torch.nn.functional.pad(xf, (0, 0, r, r), mode="replicate"),
                                    k1.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)
    return xf


def apply(domain: Domain, x: torch.Tensor) -> torch.Tensor:
    """``x`` (``uint8``, ``(n, C, H, W)``) as seen in ``domain`` (``uint8``)."""
    if domain.kind == "rotate":
        return torch.rot90(x, int(domain.value) // 90, dims=(2, 3)).contiguous()
    if domain.kind == "invert":
        return 255 - x
    if domain.kind == "blur":
        out = _gaussian(x, domain.value)
    elif domain.kind == "contrast":
        out = 128.0 + (x.float() - 128.0) * domain.value
    else:
        raise ValueError(f"unknown domain kind {domain.kind!r}")
    return out.round().clamp(0, 255).to(torch.uint8)


def plot_samples(x: torch.Tensor, domains: list[Domain], path: Path) -> Path:
    """A row per domain showing the same test images as that client sees them."""
    plt = pyplot()

    n = x.shape[0]
    fig, axes = plt.subplots(len(domains), n, figsize=(1.1 * n, 1.15 * len(domains)),
                             squeeze=False)
    for r, d in enumerate(domains):
        seen = apply(d, x)
        for c in range(n):
            ax = axes[r][c]
            img = seen[c].permute(1, 2, 0).numpy()
            ax.imshow(img.squeeze(-1) if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(f"{d.client}: {d.label}", rotation=0, ha="right", va="center",
                              fontsize=8)
    return save_figure(fig, path, dpi=100)


__all__ = ["KINDS", "Domain", "apply", "domain_of", "plot_samples"]
