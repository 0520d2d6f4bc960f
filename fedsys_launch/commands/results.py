"""The results tables and the run-directory readers shared by ``fedsys run``,
``fedsys compare`` and ``fedsys deploy run`` (single runs and runs over seeds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsys import config as cfgmod
from fedsys import metrics
from fedsys_launch.config_schema import schema


def show(title: str, columns: list[str], rows: dict[str, list[str]]) -> None:
    """Print a table on the terminal: the first column (the strategy) left, the rest right."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="left" if col == columns[0] else "right")
    for name, cells in rows.items():
        t.add_row(name, *cells)
    Console(width=max(Console().width, 120)).print(t)


def table(runs: dict[str, list[dict[str, Any]]], title: str) -> None:
    """Print the results table of ``runs`` (:func:`fedsys.metrics.results_table`'s columns)."""
    show(title, metrics.table_columns(),
         {name: metrics.summary_cells(metrics.summarise(recs)) for name, recs in runs.items()})


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


def seed_dirs(run_dir: Path) -> dict[int, Path]:
    """The per-seed run directories of a run over seeds (``seed-<k>/``), by seed."""
    out = {}
    for d in sorted(run_dir.glob("seed-*")):
        tail = d.name.split("-", 1)[1]
        if d.is_dir() and tail.isdigit():
            out[int(tail)] = d
    return dict(sorted(out.items()))


def load_seeded(run_dir: Path, prefix: str = "") -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Every strategy's records by seed: a run over seeds reads its ``seed-<k>/``
    directories; a single run is its one seed."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    dirs = seed_dirs(run_dir)
    if not dirs:
        seed = int(cfgmod.load_yaml(run_dir / "config.yaml").get("seed", 0)) \
            if (run_dir / "config.yaml").exists() else 0
        dirs = {seed: run_dir}
    for seed, d in dirs.items():
        for name, recs in load_runs(d, prefix).items():
            if recs:
                out.setdefault(name, {})[seed] = recs
    return out


def seeds_table(runs: dict[str, dict[int, list[dict[str, Any]]]], title: str) -> None:
    """Print the results table over seeds (mean ± std across seeds)."""
    show(title, metrics.seeds_columns(),
         {name: metrics.seeds_cells(metrics.seeds_summary(per)) for name, per in runs.items()})


def write_seeded(run_dir: Path, title: str) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """``results.md`` and ``accuracy.png`` of a run over seeds (across its seeds)."""
    runs = load_seeded(run_dir)
    text = metrics.seeds_results_table(runs)
    notes = metrics.privacy_notes({n: [r for recs in per.values() for r in recs]
                                   for n, per in runs.items()})
    (run_dir / "results.md").write_text(
        f"# {title}\n\nMean ± std across seeds {sorted(seed_dirs(run_dir))}; last-10 std is "
        f"each run's oscillation over its last 10 rounds, averaged over seeds; refused "
        f"replies are summed over the seeds' runs.\n\n{text}\n"
        + "".join(f"\n{n}\n" for n in notes))
    metrics.plot_seed_curves(runs, run_dir / "accuracy.png", title)
    return runs
