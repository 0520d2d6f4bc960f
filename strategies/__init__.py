"""Server side of fedsys: the strategies, one file each.

:data:`REGISTRY` is the one place a strategy becomes known: one line per method.
Each entry has a ``name``, its ``Options`` (declared in its module; they become the
config keys ``<prefix>.<option>``), ``prefix()`` and ``from_config(cfg, build)``.  A wrapper's
entry (``ima``, ``robust``, ``dp``) builds the strategy its ``<name>.base`` names and wraps it
(``IMA(strategy, **options)``, :class:`strategies.wrapper.StrategyWrapper`).
"""

from __future__ import annotations

from typing import Any

from strategies.base import FedsysStrategy, StrategyWrapper, Traits
from strategies.dp import DP
from strategies.fedavg import FedAvgStrategy
from strategies.fedavgm import FedAvgMStrategy
from strategies.fedcda import FedCDAStrategy
from strategies.fedcross import FedCrossStrategy
from strategies.fedelmy import (
    FedElmyStrategy,
    FedSeqStrategy,
    OneShotFedAvgStrategy,
    ParallelFedElmyStrategy,
)
from strategies.fedopt import FedAdamStrategy, FedYogiStrategy
from strategies.fedprox import FedProxStrategy
from strategies.ima import IMA
from strategies.robust import Robust

#: ``strategy`` name -> the class that builds it (``from_config``).
REGISTRY: dict[str, Any] = {
    "fedavg": FedAvgStrategy,
    "fedprox": FedProxStrategy,
    "fedcda": FedCDAStrategy,
    "fedcross": FedCrossStrategy,
    "fedadam": FedAdamStrategy,
    "fedavgm": FedAvgMStrategy,
    "fedyogi": FedYogiStrategy,
    "ima": IMA,
    "robust": Robust,
    "dp": DP,
    "fedelmy": FedElmyStrategy,
    "fedseq": FedSeqStrategy,
    "oneshot-fedavg": OneShotFedAvgStrategy,
    "fedelmy-parallel": ParallelFedElmyStrategy,
}

__all__ = [
    "DP",
    "IMA",
    "REGISTRY",
    "FedAdamStrategy",
    "FedAvgMStrategy",
    "FedAvgStrategy",
    "FedCDAStrategy",
    "FedCrossStrategy",
    "FedElmyStrategy",
    "FedProxStrategy",
    "FedSeqStrategy",
    "FedYogiStrategy",
    "FedsysStrategy",
    "OneShotFedAvgStrategy",
    "ParallelFedElmyStrategy",
    "Robust",
    "StrategyWrapper",
    "Traits",
]
