"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, Algorithm 1)."""

from __future__ import annotations

from fedsys.aggregate import weighted_average
from fedsys.flwr_io import ClientUpdate
from fedsys.params import Params
from strategies.base import FedsysStrategy


class FedAvgStrategy(FedsysStrategy):
    r"""Federated averaging.

    The new global model is the example-weighted mean of the accepted updates,
    :math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{n} w_k^{t+1}` (Alg. 1).
    """

    name = "fedavg"
    default_trainer = "sgd"

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Params | None:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
