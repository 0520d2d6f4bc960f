"""A ServerApp as in Flower's quickstart, with a fedsys strategy built like Flower's own."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from task import Net, load_data, test

from strategies.base import FedsysStrategy, StrategyWrapper
from strategies.fedavg import FedAvgStrategy
from strategies.fedcda import FedCDAStrategy
from strategies.fedcross import FedCrossStrategy
from strategies.fedopt import FedAdamStrategy
from strategies.fedprox import FedProxStrategy
from strategies.ima import IMA

app = ServerApp()


def make_strategy(name: str, fraction_train: float) -> FedsysStrategy | StrategyWrapper:
    """Flower's keywords plus each method's own options, no fedsys config."""
    common = {"fraction_train": fraction_train, "fraction_evaluate": 0.5,
              "min_available_nodes": 2}
    if name == "fedavg+ima":
        return IMA(FedAvgStrategy(**common), window=3, start_fraction=0.5)
    return {
        "fedavg": lambda: FedAvgStrategy(**common),
        "fedprox": lambda: FedProxStrategy(**common),
        "fedadam": lambda: FedAdamStrategy(**common, eta=0.05),
        "fedcda": lambda: FedCDAStrategy(**common, memory=2, warmup_fraction=0.5),
        "fedcross": lambda: FedCrossStrategy(**common, alpha=0.9),
    }[name]()


def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on the held-out split."""
    net = Net()
    net.load_state_dict(arrays.to_torch_state_dict())
    loss, acc = test(net, *load_data(None, 1))
    return MetricRecord({"accuracy": acc, "loss": loss})


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured strategy for ``num-server-rounds`` rounds."""
    rc = context.run_config
    strategy = make_strategy(str(rc["strategy"]), float(rc["fraction-train"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=int(rc["num-server-rounds"]),
        timeout=120,
        train_config=ConfigRecord({"lr": float(rc["lr"])}),
        evaluate_fn=central_evaluate,
    )
    accuracy = {r: float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
    print(f"{rc['strategy']}: accuracy by round {accuracy}")
    if rc["out"]:
        Path(str(rc["out"])).write_text(json.dumps({"strategy": rc["strategy"],
                                                    "accuracy": accuracy}))
