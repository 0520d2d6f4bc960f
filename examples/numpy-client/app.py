"""A Flower compat-API app (``NumPyClient``, ``flwr.server.strategy.FedAvg``) whose clients
train with a fedsys trainer through :class:`clients.numpy_client.TrainerClient`.

Written the way Flower's compat quickstart teaches: a ``client_fn`` building a
``NumPyClient``, a ``server_fn`` building Flower's own FedAvg.  The only fedsys piece is
the client's local training (Local Superior Soups by default).  Run it in Flower's
simulation engine::

    python examples/numpy-client/app.py --trainer lss --rounds 2 --nodes 3

It prints the distributed accuracy per round (the clients' ``evaluate`` on their local
splits, weighted by Flower's FedAvg) and, with ``--out FILE``, writes the history as JSON.
Data: a seeded Dirichlet split of the synthetic dataset (``--data fashion-mnist`` for the
real one); each node keeps 25 % of its share for evaluation.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from flwr.client import Client, ClientApp
from flwr.common import Context, Metrics, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from clients.base import LocalConfig
from clients.numpy_client import TrainerClient
from fedsys.data import load_dataset
from fedsys.models import build_model
from fedsys.partition import dirichlet

ARGS: dict[str, Any] = {}


def node_data(dataset: str, pid: int, nodes: int, samples: int = 0) -> tuple[torch.Tensor, ...]:
    """This node's 75 % training and 25 % evaluation share of a Dirichlet(1.0) split
    (of a random ``samples`` of it for training, when given, and a third as many for
    evaluation)."""
    ds = load_dataset(dataset, "")
    idx = torch.from_numpy(dirichlet(ds.y_train.numpy(), nodes, seed=0, alpha=1.0)[pid])
    idx = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(pid))]
    if samples:
        idx = idx[: samples + samples // 3]
    cut = int(0.75 * len(idx))
    if samples and len(idx) > samples:  # a smaller node keeps its 75 / 25 split
        cut = samples
    return ds.x_train[idx[:cut]], ds.y_train[idx[:cut]], ds.x_train[idx[cut:]], ds.y_train[idx[cut:]]


def client_fn(context: Context) -> Client:
    """One node: its model, its data, and the fedsys trainer as a NumPyClient."""
    pid, nodes = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    ds = load_dataset(ARGS["data"], "")
    x, y, xv, yv = node_data(ARGS["data"], pid, nodes, ARGS["samples"])
    net = build_model(ARGS["model"], ds.input_shape, ds.num_classes, seed=0)
    return TrainerClient(net, x, y, ds.normalise, ARGS["trainer"], x_eval=xv, y_eval=yv,
                         options=ARGS["options"], partition_id=pid,
                         local=LocalConfig(epochs=1, batch_size=64, lr=ARGS["lr"])).to_client()


def weighted_accuracy(metrics: list[tuple[int, Metrics]]) -> Metrics:
    """Example-weighted mean of the clients' accuracy (Flower's quickstart)."""
    n = sum(k for k, _ in metrics)
    return {"accuracy": sum(k * float(m["accuracy"]) for k, m in metrics) / n}


def server_fn(context: Context) -> ServerAppComponents:
    """Flower's own FedAvg from the same initial model every node builds."""
    ds = load_dataset(ARGS["data"], "")
    net = build_model(ARGS["model"], ds.input_shape, ds.num_classes, seed=0)
    strategy = FedAvg(
        fraction_fit=ARGS["fraction"], fraction_evaluate=1.0,
        initial_parameters=ndarrays_to_parameters([v.numpy() for v in net.state_dict().values()]),
        on_fit_config_fn=lambda rnd: {"server-round": rnd},
        evaluate_metrics_aggregation_fn=weighted_accuracy,
        fit_metrics_aggregation_fn=lambda ms: {"train-loss": sum(
            k * float(m["train-loss"]) for k, m in ms) / sum(k for k, _ in ms)})
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ARGS["rounds"]))


def main() -> None:
    """Run the app in Flower's simulation engine and report the history."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="lss", help="a fedsys trainer (sgd, fedprox, lss, fedelmy, fedseq)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--data", default="synthetic", choices=("synthetic", "fashion-mnist"))
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=0,
                    help="training samples per node (0: its whole 75 %% share)")
    ap.add_argument("--fraction", type=float, default=1.0,
                    help="FedAvg's fraction_fit: the share of nodes that train each round")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a trainer option, e.g. lss.ingredients=3 (repeatable)")
    ap.add_argument("--out", help="write the history here as JSON")
    args = ap.parse_args()
    options = {k: float(v) if "." in v or "e" in v else int(v)
               for k, v in (o.split("=", 1) for o in args.option)}
    ARGS.update(trainer=args.trainer, rounds=args.rounds, data=args.data, lr=args.lr,
                samples=args.samples, fraction=args.fraction,
                options=options, model="mlp" if args.data == "synthetic" else "fmnist-cnn")
    from flwr.simulation import run_simulation

    history: dict[str, Any] = {}

    def recording_server_fn(context: Context) -> ServerAppComponents:
        comps = server_fn(context)
        strategy = comps.strategy
        original = strategy.aggregate_evaluate  # type: ignore[union-attr]

        def aggregate_evaluate(rnd: int, results: Any, failures: Any) -> Any:
            out = original(rnd, results, failures)
            history.setdefault("accuracy", {})[rnd] = out[1]["accuracy"]
            history.setdefault("failures", {})[rnd] = len(failures)
            return out

        strategy.aggregate_evaluate = aggregate_evaluate  # type: ignore[union-attr, method-assign]
        return comps

    run_simulation(server_app=ServerApp(server_fn=recording_server_fn),
                   client_app=ClientApp(client_fn=client_fn), num_supernodes=args.nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2}})
    for rnd, acc in sorted(history.get("accuracy", {}).items()):
        print(f"round {rnd}: distributed accuracy {acc:.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    main()
