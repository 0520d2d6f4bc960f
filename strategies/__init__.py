"""Server side of fedsys: strategies and the Flower ServerApp."""

from __future__ import annotations

from strategies.base import FedsysStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedcda import FedCDAStrategy
from strategies.fedprox import FedProxStrategy

REGISTRY: dict[str, type[FedsysStrategy]] = {
    cls.name: cls for cls in (FedAvgStrategy, FedProxStrategy, FedCDAStrategy)
}

__all__ = ["REGISTRY", "FedAvgStrategy", "FedCDAStrategy", "FedProxStrategy", "FedsysStrategy"]
