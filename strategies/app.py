"""The fedsys ServerApp (``[tool.flwr.app.components] serverapp``)."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsys.config import from_run_config
from strategies.runner import run_experiment

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Read the run config from Flower and run the experiment."""
    run_experiment(grid, from_run_config(context.run_config))
