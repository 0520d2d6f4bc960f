"""The template's ClientApp with a fedsys trainer doing its local training
(``clients.message.local_train``, as docs/flower-apps.md shows): the same handlers, the same data
and model, Adam as the template trains; the trainer is the run config's ``client-trainer``
(``lss``), or with ``strategy`` left to choose (``""``), the strategy's own (the FedELMY
chain sends ``fedelmy``: its diverse pool)."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from task import Net, load_data

from clients import LocalConfig
from clients.message import local_evaluate, local_train

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model with the fedsys trainer on this node's training split."""
    pid = int(context.node_config["partition-id"])
    trainloader, _ = load_data(pid, int(context.node_config["num-partitions"]))
    data = trainloader.dataset
    local = LocalConfig(epochs=int(context.run_config["local-epochs"]), batch_size=32,
                        optimizer="adam")
    trainer = str(context.run_config.get("client-trainer", "lss")) or None
    return local_train(msg, context, Net(), data.x, data.y, trainer=trainer,
                       options={"lss.ingredients": 2, "fedelmy.pool-size": 2},
                       local=local, partition_id=pid)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's validation split."""
    _, valloader = load_data(int(context.node_config["partition-id"]),
                             int(context.node_config["num-partitions"]))
    return local_evaluate(msg, Net(), valloader.dataset.x, valloader.dataset.y)
