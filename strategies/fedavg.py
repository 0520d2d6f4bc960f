"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, Algorithm 1)."""

from __future__ import annotations

from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits


class FedAvgStrategy(FedsysStrategy):
    r"""Federated averaging.

    The new global model is the example-weighted mean of the accepted updates,
    :math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{n} w_k^{t+1}` (Alg. 1), the mean a
    robust rule may replace (:meth:`average`).  Built like Flower's ``FedAvg``::

        FedAvgStrategy(fraction_train=0.5, min_available_nodes=2)
    """

    name = "fedavg"
    default_trainer = "sgd"
    traits = Traits(asks="sample", mean="round")

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """Alg. 1's weighted mean of the accepted updates."""
        return Aggregate(self.average(server_round, [u.params for u in updates],
                                      [u.num_examples for u in updates]))
