"""A ClientApp as in Flower's quickstart: train and evaluate handlers, nothing else
(no query handler, no partition-id in the replies), and Flower's metric names
(``train_loss``, ``eval_loss``, ``eval_acc``, ``num-examples``)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import Net, load_data, test, train

app = ClientApp()


def received(msg: Message, context: Context) -> tuple[Net, torch.Tensor, torch.Tensor]:
    """The model the server sent, and this node's data."""
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]))
    return net, x, y


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the received model on this node's data."""
    net, x, y = received(msg, context)
    loss = train(net, x, y, int(context.run_config["local-epochs"]),
                 float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}),
                   reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's data."""
    net, x, y = received(msg, context)
    loss, acc = test(net, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
