"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, Algorithm 1)."""

from __future__ import annotations

from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy


class FedAvgStrategy(FedsysStrategy):
    r"""Federated averaging.

    The new global model is the example-weighted mean of the accepted updates,
    :math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{n} w_k^{t+1}` (Alg. 1), passed through
    the wrappers (:meth:`finish`).  Built like Flower's ``FedAvg``::

        FedAvgStrategy(fraction_train=0.5, min_available_nodes=2)
    """

    name = "fedavg"
    default_trainer = "sgd"

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        """Alg. 1's weighted mean of the accepted updates (then the wrappers)."""
        new = self.average(server_round, [u.params for u in updates], [u.num_examples for u in updates])
        return Aggregate(self.finish(server_round, {0: new})[0])
