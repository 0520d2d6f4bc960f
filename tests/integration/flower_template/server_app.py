"""The ServerApp of Flower 1.41's PyTorch app template (Message API), in its shape: the
run config's ``fraction-train``, ``num-server-rounds`` and ``lr``, the global model as an
``ArrayRecord``, ``strategy.start(...)`` and the final model saved to disk.  One line
differs: the strategy is a fedsys strategy (:mod:`fedsys_line`) instead of Flower's
``FedAvg(fraction_train=fraction_train)``."""

import torch
from fedsys_line import fedsys_strategy
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy for ``num-server-rounds`` rounds and save the final model."""
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    arrays = ArrayRecord(Net().state_dict())

    strategy = fedsys_strategy(str(context.run_config["strategy"]), fraction_train)  # the change

    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    print("\nSaving final model to disk...")
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
