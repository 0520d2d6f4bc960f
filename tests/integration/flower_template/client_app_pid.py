"""The template's ClientApp with one addition a Flower user naturally makes: its train
replies carry ``partition-id`` (the node's ``node_config`` value) among their metrics."""

from client_app import evaluate as template_evaluate
from client_app import train as template_train
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The template's training, ``partition-id`` added to the reply's metrics."""
    reply = template_train(msg, context)
    reply.content["metrics"]["partition-id"] = int(context.node_config["partition-id"])
    return reply


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The template's evaluation."""
    return template_evaluate(msg, context)
