"""A plain Flower client is enough: a ClientApp written from Flower's quickstart (an
``@app.train`` that replies with ``arrays`` and ``num-examples``; no query handler, no
``partition-id``) works with every fedsys strategy that can work with it, in the real
simulation engine; FedCDA, which needs each reply's training loss, says so once, naming
the key, and the run ends with an error instead of a silent success."""

from __future__ import annotations

import logging

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsys import metrics
from fedsys.data import make_synthetic
from fedsys.models import build_model
from fedsys_launch.config_schema import build
from fedsys_launch.engines.simulation import simulate
from strategies.base import NoUsableUpdateError

pytestmark = pytest.mark.slow

BASE = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "lr": 0.05,
        "num-clients": 3, "clients-per-round": 2, "num-server-rounds": 3, "seed": 2,
        "fedavgm.server-learning-rate": 0.5, "fedavgm.server-momentum": 0.9}

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Flower's quickstart, in short: load the model, train one epoch, reply."""
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    ds = make_synthetic()
    x, y = ds.x_train[pid::n], ds.y_train[pid::n]
    net = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(net.parameters(), lr=float(msg.content["config"]["lr"]))
    for i in range(0, len(y), 32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(ds.normalise(x[i:i + 32])), y[i:i + 32]).backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)


STRATEGIES = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedavgm", "fedcross", "ima[ima.base=fedavg]",
              "ima[ima.base=fedcross]"]


def test_every_strategy_that_can_trains_with_a_plain_flower_client(tmp_path, caplog):
    cfg = build({**BASE, "output-dir": str(tmp_path), "name": "plain",
                 "strategy": ",".join(STRATEGIES), "ima.start-round": 1,
                 "query-partitions": False})  # the client has no query handler
    with caplog.at_level(logging.INFO):
        simulate(cfg, client_app=app)
    logged = [r.getMessage() for r in caplog.records]
    # no query was sent (the ClientApp would fail it, and the server say it went unanswered)
    assert not [m for m in logged if "partition-id query" in m]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    for label in cfg.strategies:
        recs = metrics.read_jsonl(tmp_path / "plain" / label / "metrics.jsonl")
        assert [r["round"] for r in recs] == [0, 1, 2, 3], label
        assert all(r["clients-ok"] == 2 and r["clients-rejected"] == 0 for r in recs[1:]), label
        assert "train-loss" not in recs[1]  # nobody reported one, and none is made up
        assert recs[-1]["accuracy"] > recs[0]["accuracy"], label


def test_fedcda_names_the_missing_key_once_and_the_run_fails(tmp_path, caplog):
    cfg = build({**BASE, "output-dir": str(tmp_path), "name": "cda", "strategy": "fedcda"})
    with caplog.at_level(logging.INFO), pytest.raises(NoUsableUpdateError, match="no round"):
        simulate(cfg, client_app=app)
    logged = [r.getMessage() for r in caplog.records]
    told = [m for m in logged if "needs the metric 'train-loss'" in m]
    assert len(told) == 1, told
    assert any("no usable update" in m for m in logged)
