"""fedsys's strategies side by side with Flower's own Message-API strategies
(``flwr.serverapp.strategy``) on the same instructions and replies: where fedsys's class is
built with Flower's keywords, the round ends where Flower's ends.

``reply_grid`` (``tests/conftest.py``) hands out the node ids and answers fedsys's
partition-id query; the train replies are built as a ClientApp builds them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedYogi

from fedsys import protocol
from strategies.fedavg import FedAvgStrategy
from strategies.fedopt import FedAdamStrategy, FedYogiStrategy

NODES = {101: 0, 205: 1, 333: 2}  # node id -> partition id
EXAMPLES = {0: 10, 1: 20, 2: 25}


def _model(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32),
            "b": (np.linspace(0.5, 1.5, 3) * v).astype(np.float32)}


def _reply(msg: Message, rnd: int) -> Message:
    """Node ``pid``'s trained model: the round's start moved by its own amount."""
    pid = NODES[msg.metadata.dst_node_id]
    sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    trained = {k: v + np.float32(0.05 * (pid + 1) * (-1) ** rnd) for k, v in sent.items()}
    return Message(RecordDict({"arrays": ArrayRecord({k: protocol.Array(v) for k, v in trained.items()}),
                               "metrics": MetricRecord({"num-examples": EXAMPLES[pid],
                                                        "partition-id": pid})}), reply_to=msg)


def _rounds(strategy: Any, grid: Any, rounds: int) -> list[dict[str, np.ndarray]]:
    """``rounds`` rounds of train: each round's model from the last's."""
    arrays = ArrayRecord({k: protocol.Array(v) for k, v in _model(1.0).items()})
    out = []
    for rnd in range(1, rounds + 1):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))
        assert sorted(m.metadata.dst_node_id for m in msgs) == sorted(NODES)
        grid.push_messages(msgs)  # message ids, as the runtime gives them
        grid.outbox.clear()
        new, _ = strategy.aggregate_train(rnd, [_reply(m, rnd) for m in msgs])
        assert new is not None
        arrays = new
        out.append({k: v.numpy().astype(np.float64) for k, v in new.items()})
    return out


@pytest.mark.parametrize(("ours", "flowers", "correction"),
                         [(FedAdamStrategy, FedAdam, True), (FedYogiStrategy, FedYogi, False)],
                         ids=["fedadam", "fedyogi"])
def test_fedopt_ends_where_flowers_ends(reply_grid, ours, flowers, correction):
    """Flower's FedAdam corrects the bias, with the exponent server_round + 1, and its
    FedYogi does not; fedsys's correct with ``bias_correction=True`` (off by default: the
    IMA code's)."""
    keywords = {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3,
                "fraction_train": 1.0, "min_available_nodes": 3}
    theirs = _rounds(flowers(**keywords), reply_grid(NODES), 3)
    mine = _rounds(ours(**keywords, bias_correction=correction), reply_grid(NODES), 3)
    for rnd, (a, b) in enumerate(zip(mine, theirs, strict=True), 1):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"round {rnd} {k}")
    other = _rounds(ours(**keywords, bias_correction=not correction), reply_grid(NODES), 1)
    assert not np.allclose(other[0]["w"], theirs[0]["w"], rtol=1e-3)  # the switch matters


def test_fedavg_ends_where_flowers_ends(reply_grid):
    keywords = {"fraction_train": 1.0, "min_available_nodes": 3}
    theirs = _rounds(FedAvg(**keywords), reply_grid(NODES), 2)
    mine = _rounds(FedAvgStrategy(**keywords), reply_grid(NODES), 2)
    for a, b in zip(mine, theirs, strict=True):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6)


def test_fraction_train_zero_skips_training_as_flowers_does(reply_grid, caplog):
    arrays = ArrayRecord({k: protocol.Array(v) for k, v in _model(1.0).items()})
    theirs = list(FedAvg(fraction_train=0.0).configure_train(1, arrays, ConfigRecord(),
                                                             reply_grid(NODES)))
    with caplog.at_level(logging.WARNING):
        ours = FedAvgStrategy(fraction_train=0.0)
    assert "fraction_train is set to 0.0: federated training is skipped" in caplog.text
    caplog.clear()
    assert theirs == [] and list(ours.configure_train(1, arrays, ConfigRecord(),
                                                      reply_grid(NODES))) == []
    new, _ = ours.aggregate_train(1, [])
    assert new is None and "no usable update" not in caplog.text  # nothing was asked
    # a fixed number of clients a round (fedsys's clients_per_round) still trains
    fixed = FedAvgStrategy(fraction_train=0.0, clients_per_round=2, min_train_nodes=2)
    assert len(list(fixed.configure_train(1, arrays, ConfigRecord(), reply_grid(NODES)))) == 2
