"""The ClientApp of Flower 1.41's PyTorch app template (Message API), in its shape:
a ``@app.train()`` and an ``@app.evaluate()`` handler, the partition read from
``context.node_config``, the replies in Flower's names (``arrays``; ``metrics`` with
``train_loss``, ``eval_loss``, ``eval_acc``, ``num-examples``).  No query handler and no
``partition-id`` in the replies: nothing of fedsys."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import Net, load_data
from task import test as test_fn
from task import train as train_fn

app = ClientApp()


def _received_model(msg: Message) -> tuple[Net, torch.device]:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return net.to(device), device


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's training split."""
    net, device = _received_model(msg)
    trainloader, _ = load_data(context.node_config["partition-id"],
                               context.node_config["num-partitions"])
    train_loss = train_fn(net, trainloader, context.run_config["local-epochs"],
                          msg.content["config"]["lr"], device)
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's validation split."""
    net, device = _received_model(msg)
    _, valloader = load_data(context.node_config["partition-id"],
                             context.node_config["num-partitions"])
    eval_loss, eval_acc = test_fn(net, valloader, device)
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc,
                            "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
