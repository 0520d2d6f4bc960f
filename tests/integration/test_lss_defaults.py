"""LSS with no option set learns (issue 40): through :class:`TrainerClient`, as a Flower
compat app of one's own uses it (4 nodes of 500 Fashion-MNIST samples, a Dirichlet 1.0
split, the fedsys CNN, FedAvg's weighted mean), LSS at Adam's documented lr (5e-4) stays
within 2 points of the ``sgd`` trainer at its defaults at every round from round 3 on.

The rounds run in this process (Flower's FedAvg aggregation, ``aggregate`` of
``flwr.server.strategy.aggregate``, over the clients' ``fit`` replies), so the two
trainers see the same clients and the same starts; the same client in Flower's
simulation engine is tests/integration/test_numpy_client.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import aggregate

from clients.base import LocalConfig
from clients.numpy_client import TrainerClient
from fedsys.data import load_dataset
from fedsys.models import build_model
from fedsys.partition import dirichlet
from fedsys.task import score

pytestmark = pytest.mark.slow
NODES, SAMPLES, ROUNDS = 4, 500, 4


def _accuracy_per_round(trainer: str, lr: float, options: dict[str, float] | None = None
                        ) -> list[float]:
    ds = load_dataset("fashion-mnist")
    parts = dirichlet(ds.y_train.numpy(), NODES, seed=0, alpha=1.0)
    clients = []
    for pid, part in enumerate(parts):
        idx = torch.from_numpy(np.random.default_rng(pid).permutation(part)[:SAMPLES])
        net = build_model("fmnist-cnn", ds.input_shape, ds.num_classes, seed=0)
        clients.append(TrainerClient(net, ds.x_train[idx], ds.y_train[idx], ds.normalise,
                                     trainer, partition_id=pid, options=options,
                                     local=LocalConfig(epochs=1, batch_size=64, lr=lr)))
    net = build_model("fmnist-cnn", ds.input_shape, ds.num_classes, seed=0)
    params = [v.numpy() for v in net.state_dict().values()]
    out = []
    for rnd in range(1, ROUNDS + 1):
        replies = [c.fit(params, {"server-round": rnd}) for c in clients]
        params = aggregate([(p, n) for p, n, _ in replies])
        net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in
                             zip(net.state_dict(), params, strict=True)})
        out.append(score(net, ds.normalise, ds.x_test[:2000], ds.y_test[:2000], 256,
                         torch.device("cpu"))[1])
    return out


def test_lss_at_its_defaults_keeps_up_with_sgd():
    torch.set_num_threads(1)  # as a simulation actor (torch-threads); 2 threads on 2 busy cores crawl
    sgd = _accuracy_per_round("sgd", LocalConfig().lr)
    lss = _accuracy_per_round("lss", 5e-4)
    print("sgd", [round(a, 4) for a in sgd], "lss", [round(a, 4) for a in lss])
    assert sgd[-1] > 0.4  # the comparison is between two runs that learn (chance: 0.1)
    for rnd in range(3, ROUNDS + 1):
        assert lss[rnd - 1] >= sgd[rnd - 1] - 0.02, (rnd, sgd, lss)
