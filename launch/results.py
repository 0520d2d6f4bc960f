"""The results table and the run-directory reader shared by ``fedsys run``,
``fedsys compare`` and ``fedsys deploy run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsys import config as cfgmod
from fedsys import metrics
from launch.registry import schema


def table(runs: dict[str, list[dict[str, Any]]], title: str) -> None:
    """Print the results table (final, best, last-10 accuracy, time) of ``runs``."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in ("strategy", "rounds", "final acc %", "best acc %", "last-10 mean %",
                "last-10 std", "time s"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for name, recs in runs.items():
        s = metrics.summarise(recs)
        if not s:
            t.add_row(name, "0", "-", "-", "-", "-", "-")
            continue
        t.add_row(name, str(int(s["rounds"])), f"{100 * s['final']:.2f}", f"{100 * s['best']:.2f}",
                  f"{100 * s['last_mean']:.2f}", f"{100 * s['last_std']:.2f}", f"{s['time_s']:.0f}")
    Console(width=max(Console().width, 110)).print(t)


def load_runs(run_dir: Path, prefix: str = "") -> dict[str, list[dict[str, Any]]]:
    """Per-round records of every strategy of a run directory, by label."""
    out: dict[str, list[dict[str, Any]]] = {}
    cfg_path = run_dir / "config.yaml"
    names = (
        [v.label for v in cfgmod.parse_strategy(str(cfgmod.load_yaml(cfg_path)["strategy"]), schema())]
        if cfg_path.exists() else []
    )
    for name in names or sorted(p.parent.name for p in run_dir.glob("*/metrics.jsonl")):
        recs = metrics.read_jsonl(run_dir / name.strip() / "metrics.jsonl")
        out[f"{prefix}{name.strip()}"] = recs
    return out
