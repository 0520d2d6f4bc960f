"""The app's own task: a small MLP on a seeded synthetic dataset, split by partition-id.

Nothing here knows fedsys; it is what a Flower user brings.
"""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """A two-layer perceptron on 16 features, 4 classes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_data(partition_id: int | None, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class prototypes plus noise; partition ``i`` of ``n`` (``None``: the test split)."""
    gen = torch.Generator().manual_seed(7)
    protos = torch.randn(4, 16, generator=gen)
    n = 4000
    y = torch.randint(0, 4, (n,), generator=gen)
    x = protos[y] + 2.5 * torch.randn(n, 16, generator=gen)
    if partition_id is None:
        return x[-800:], y[-800:]
    return x[:-800][partition_id::num_partitions], y[:-800][partition_id::num_partitions]


def train(net: Net, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> float:
    """Plain SGD; returns the mean loss of the last epoch."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    total = 0.0
    for _ in range(epochs):
        total = 0.0
        for i in range(0, len(y), 32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[i:i + 32]), y[i:i + 32])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y[i:i + 32])
    return total / len(y)


def test(net: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean loss and accuracy."""
    with torch.no_grad():
        out = net(x)
        return float(nn.functional.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())
