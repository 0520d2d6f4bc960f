"""Calls of the strategies' constructors that mypy checks (pyproject's ``files``): the right
ones pass, and each wrong one carries the ``type: ignore`` of its error, which ``strict``
mypy reports as unused if the constructor's keywords were not visible to it
(``test_settings.py``).  Never run: mypy reads it."""

from __future__ import annotations

from strategies import (
    FedAdamStrategy,
    FedAvgMStrategy,
    FedAvgStrategy,
    FedCDAStrategy,
    FedCrossStrategy,
    FedElmyStrategy,
    FedProxStrategy,
)


def calls() -> None:
    """Constructors called as a Flower user calls them, right and wrong."""
    FedAvgStrategy(fraction_train=0.5, min_available_nodes=2, seed=3, clients_per_round=None)
    FedProxStrategy(proximal_mu=0.1, fraction_evaluate=0.0)
    FedAdamStrategy(eta=0.05, beta_1=0.8, bias_correction=False, fraction_train=1.0)
    FedAvgMStrategy(server_learning_rate=0.5, server_momentum=0.9)
    FedCDAStrategy(memory=2, selection="newest", fraction_train=0.25, query_partitions=True)
    FedCrossStrategy(alpha=0.9, clients_per_round=3)
    FedElmyStrategy(passes=2, order="permutation")
    FedCDAStrategy(memroy=2)  # type: ignore[call-arg]
    FedAvgStrategy(fraction_trian=0.5)  # type: ignore[call-arg]
    FedCDAStrategy(memory="2")  # type: ignore[arg-type]
    FedAvgStrategy(seed="7")  # type: ignore[arg-type]
