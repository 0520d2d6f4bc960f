"""The template's ClientApp with the additions of Flower's tutorial "Communicate custom
Messages" (its part after the quickstart): a ``training_time`` metric, "aggregated
automatically by the strategy", and an object sent beside the model and the metrics in a
ConfigRecord ``train_metadata``, which the strategy leaves to an ``aggregate_train``
override (``fedsys_line.TutorialFedCDA``).  The tutorial pickles a dataclass; JSON bytes
here, as its own warning advises."""

import json
import time

from client_app import evaluate as template_evaluate
from client_app import train as template_train
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The template's training, its time and a metadata object added to the reply."""
    start_time = time.time()
    reply = template_train(msg, context)
    training_time = time.time() - start_time
    reply.content["metrics"]["training_time"] = training_time  # the new metric
    meta = {"training_time": training_time, "converged": True,
            "partition": int(context.node_config["partition-id"])}
    reply.content["train_metadata"] = ConfigRecord({"meta": json.dumps(meta).encode()})
    return reply


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The template's evaluation."""
    return template_evaluate(msg, context)
