"""Server side of fedsys: strategies and the Flower ServerApp."""

from __future__ import annotations

from collections.abc import Callable

from fedsys.config import RunConfig
from strategies.base import FedsysStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedcda import FedCDAStrategy
from strategies.fedcross import FedCrossStrategy
from strategies.fedopt import FedAdamStrategy, FedYogiStrategy
from strategies.fedprox import FedProxStrategy

#: Strategies with their own aggregation (IMA can sit on any of them).
BASES: dict[str, type[FedsysStrategy]] = {
    cls.name: cls
    for cls in (FedAvgStrategy, FedProxStrategy, FedCDAStrategy, FedCrossStrategy,
                FedAdamStrategy, FedYogiStrategy)
}

from strategies.ima import ima_strategy  # noqa: E402  (needs BASES at call time only)

#: ``strategy`` name -> constructor taking the run config.
REGISTRY: dict[str, Callable[[RunConfig], FedsysStrategy]] = {**BASES, "ima": ima_strategy}

__all__ = ["BASES", "REGISTRY", "FedAdamStrategy", "FedAvgStrategy", "FedCDAStrategy",
           "FedCrossStrategy", "FedProxStrategy", "FedYogiStrategy", "FedsysStrategy"]
