"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020)."""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy


class FedProxStrategy(FedAvgStrategy):
    r"""FedProx: FedAvg aggregation with a proximal local objective.

    Clients minimise :math:`h_k(w; w^t) = F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2`
    (Eq. 2) with the ``fedprox`` trainer (:mod:`clients.fedprox`), whose option
    ``fedprox.mu`` sets :math:`\mu` (in a Flower app: ``train_config`` key
    ``fedprox.mu``).  Server aggregation is FedAvg's weighted mean.
    """

    name = "fedprox"
    default_trainer = "fedprox"
