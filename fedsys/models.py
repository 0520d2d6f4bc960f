"""Model registry: build a ``torch.nn.Module`` by config name.

Every builder takes the input shape ``(C, H, W)`` and the number of classes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedsys.seeding import seed_torch

Builder = Callable[..., nn.Module]
MODELS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Add a model builder to :data:`MODELS` under ``name``."""

    def deco(fn: Builder) -> Builder:
        MODELS[name] = fn
        return fn

    return deco


def _after_two_conv_blocks(h: int, w: int) -> int:
    """Positions left of an ``h`` x ``w`` input after two blocks of a 5x5 convolution (no
    padding) and a 2x2 max-pool: 16 on 28x28, 25 on 32x32."""
    return (((h - 4) // 2 - 4) // 2) * (((w - 4) // 2 - 4) // 2)


@register("fmnist-cnn")
def fmnist_cnn(in_shape: tuple[int, int, int], num_classes: int, **_: object) -> nn.Module:
    """CNN of the FedCDA paper for Fashion-MNIST (§5.1).

    conv 5x5 (32) -> 2x2 max-pool -> conv 5x5 (64) -> 2x2 max-pool -> FC 512 + ReLU
    -> FC output.  The paper does not state padding; we use none (582,026 weights
    on 28x28 inputs, FedCDA spec §4).
    """
    c, h, w = in_shape
    return nn.Sequential(
        nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * _after_two_conv_blocks(h, w), 512), nn.ReLU(),
        nn.Linear(512, num_classes),
    )


@register("cifar-cnn")
def cifar_cnn(in_shape: tuple[int, int, int], num_classes: int, **_: object) -> nn.Module:
    """The CIFAR CNN of McMahan et al. (2017) / FedCross: two 5x5 conv blocks, FC 384-192."""
    c, h, w = in_shape
    return nn.Sequential(
        nn.Conv2d(c, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * _after_two_conv_blocks(h, w), 384), nn.ReLU(),
        nn.Linear(384, 192), nn.ReLU(),
        nn.Linear(192, num_classes),
    )


@register("resnet18")
def resnet18(
    in_shape: tuple[int, int, int], num_classes: int, norm: str = "bn", **_: object
) -> nn.Module:
    """ResNet-18 with a 3x3 stem for small images; ``norm='gn'`` uses GroupNorm(2, C)."""
    norm_layer: Callable[[int], nn.Module]
    if norm == "gn":
        def norm_layer(ch: int) -> nn.Module:
            return nn.GroupNorm(2, ch)
    else:
        norm_layer = nn.BatchNorm2d
    # imported here: torchvision.models pulls in torch._dynamo (about 1.5 s and 100 MiB
    # in every process, ClientApps of the small models included)
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(num_classes=num_classes, norm_layer=norm_layer)
    if in_shape[1] <= 64:
        net.conv1 = nn.Conv2d(in_shape[0], 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    elif in_shape[0] != 3:
        net.conv1 = nn.Conv2d(in_shape[0], 64, 7, 2, 3, bias=False)
    return net


@register("mlp")
def mlp(in_shape: tuple[int, int, int], num_classes: int, **_: object) -> nn.Module:
    """A small MLP (one hidden layer of 64 units) for tests and smoke runs."""
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(), nn.Linear(64, num_classes))


@register("blitz-cnn")
def blitz_cnn(in_shape: tuple[int, int, int], num_classes: int, **_: object) -> nn.Module:
    """The small CNN of PyTorch's 60-minute blitz, the model of Flower's app template.

    conv 5x5 (6) -> 2x2 max-pool -> conv 5x5 (16) -> 2x2 max-pool -> FC 120 -> FC 84 ->
    FC output, ReLU between (44,426 weights on 28x28 inputs, 62,006 on 3x32x32): a Flower
    user's first model, and one on which FedELMY's proximity pull outweighs the loss
    (``docs/results/fedelmy.md``, "A small model").
    """
    c, h, w = in_shape
    return nn.Sequential(
        nn.Conv2d(c, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * _after_two_conv_blocks(h, w), 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes),
    )


def build_model(
    name: str,
    in_shape: tuple[int, int, int],
    num_classes: int,
    seed: int,
    norm: str = "bn",
) -> nn.Module:
    """Build model ``name`` with weights initialised from ``seed``."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; registered: {', '.join(sorted(MODELS))}")
    with torch.random.fork_rng(devices=[]):
        seed_torch(seed)
        return MODELS[name](in_shape, num_classes, norm=norm)
