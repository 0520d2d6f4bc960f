"""Per-round metrics: JSON lines, CSV, curves and the results table."""

from __future__ import annotations

import csv
import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fedsys.protocol import TRAINED_EXAMPLES


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(dict(record)) + "\n")


class MetricsFileError(ValueError):
    """A metrics file that cannot be read; the message names the file and the line."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read all records (missing file: empty list).

    A last line that does not parse and lacks its newline is what a process stopped in the
    middle of :func:`append_jsonl` leaves: it is dropped (its round has no checkpoint yet,
    so a resume runs it again).  Any other line that is not a JSON object raises
    :class:`MetricsFileError`.
    """
    if not path.exists():
        return []
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise MetricsFileError(f"{path} is not a text file of JSON records") from None
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) and not text.endswith("\n"):
                break  # torn by an interrupted append
            raise MetricsFileError(f"{path} line {i} is not a JSON record ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise MetricsFileError(f"{path} line {i} is not a JSON object")
        out.append(rec)
    return out


def write_jsonl(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Rewrite a JSON-lines file."""
    path.write_text("".join(json.dumps(dict(r)) + "\n" for r in records))


def write_csv(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write records as CSV with the union of their keys as columns."""
    keys: list[str] = []
    for r in records:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(records)


def summarise(records: Sequence[Mapping[str, Any]], last: int = 10) -> dict[str, float]:
    """Final, best, and mean/std over the last ``last`` rounds of test accuracy; the
    time; the client-training work (``work``: the sum of every round's
    ``trained-examples``, 0 where none was reported); the training traffic at the end
    (``bytes``: down plus up) and ``bytes_per_client`` (that over ``clients-reached``);
    ``steps``, the rounds run (a chain's hops; ``rounds`` counts the evaluated ones),
    ``hops`` 1 when every round is a chain's hop, and ``refused``, the client replies
    refused or missing over the run (the sum of every round's ``clients-rejected``)."""
    acc = [float(r["accuracy"]) for r in records if "accuracy" in r and r.get("round", 0) > 0]
    if not acc:
        return {}
    tail = np.asarray(acc[-last:])
    final = records[-1]
    traffic = float(final.get("bytes-down", 0)) + float(final.get("bytes-up", 0))
    reached = float(final.get("clients-reached", 0))
    return {
        "rounds": float(len(acc)),
        "final": acc[-1],
        "best": max(acc),
        "last_mean": float(tail.mean()),
        "last_std": float(tail.std()),
        "time_s": float(sum(float(r.get("round-time", 0.0)) for r in records)),
        "work": float(sum(float(r.get(TRAINED_EXAMPLES, 0.0)) for r in records)),
        "bytes": traffic,
        "bytes_per_client": traffic / reached if reached else float("nan"),
        "steps": float(sum(1 for r in records if r.get("round", 0) > 0)),
        "hops": float(all(int(r.get("hop", 0)) > 0 for r in records if r.get("round", 0) > 0)),
        "refused": float(sum(float(r.get("clients-rejected", 0)) for r in records)),
    }


def work_curve(records: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """``(client-training work so far, test accuracy)`` after every evaluated round:
    the work is the running sum of ``trained-examples`` (round 0 at 0)."""
    out, work = [], 0.0
    for r in records:
        work += float(r.get(TRAINED_EXAMPLES, 0.0))
        if "accuracy" in r:
            out.append((work, float(r["accuracy"])))
    return out


def results_table(runs: Mapping[str, Sequence[Mapping[str, Any]]], last: int = 10) -> str:
    """A Markdown table comparing runs: accuracy in %, rounds (or a chain's hops),
    client-training work in thousands of trained examples, training traffic per client
    that took part (MB, down + up), time."""
    cols = table_columns(last)
    lines = ["| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
    for name, recs in runs.items():
        cells = summary_cells(summarise(recs, last))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_columns(last: int = 10) -> list[str]:
    """The column names of :func:`results_table` (and of the terminal's table)."""
    return ["strategy", "rounds", "final acc %", "best acc %", f"last-{last} mean %",
            f"last-{last} std", "client work (k examples)", "MB per client", "refused replies",
            "time s"]


#: What the columns of :func:`results_table` mean, under the table of a results page.
COLUMNS_NOTE = (
    "Accuracy is central test accuracy after each round (a chain: after each hop); last-10 is "
    "the mean and std over the last 10 evaluations. Client work: examples the clients' local "
    "training went through, summed over the run (every epoch and every model a client "
    "trains: a pool or a soup counts each member). MB per client: training traffic (models "
    "sent down and replies sent up, serialised) over the clients that took part. The "
    "figure plots accuracy against client work, so a chain's hops and a parallel method's "
    "rounds compare at equal effort. Refused replies: client replies refused or missing over "
    "the run (the log's 'rejected reply' lines say why); above 0, some rounds rest on fewer "
    "clients than they asked.")


def results_page(title: str, about: str, table: str, notes: Sequence[str] = ()) -> str:
    """A run's ``results.md``: title, what the run is for, the table, what its columns
    mean, ``notes`` (:func:`privacy_notes`), the figure."""
    parts = [f"# {title}", about.strip(), table, COLUMNS_NOTE, *notes,
             "![test accuracy](accuracy.png)"]
    return "\n\n".join(p for p in parts if p) + "\n"


def privacy_notes(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """What a results page says of its differentially private runs (those whose records
    hold ``dp-epsilon``): what the epsilon covers and what the records release outside
    it, and, for a run whose noise came from its seed (``dp-reproducible-noise`` 1), that
    its epsilon does not hold against whoever has read the seed (issue 65)."""
    from fedsys.dp import OUTSIDE_EPSILON

    private = [n for n, recs in runs.items() if any("dp-epsilon" in r for r in recs)]
    if not private:
        return []
    seeded = [n for n in private if any(r.get("dp-reproducible-noise") == 1.0 for r in runs[n])]
    notes = [f"Differential privacy ({', '.join(private)}): dp-epsilon covers the released "
             f"models only; these numbers of the records come from the clients' raw replies and "
             f"are released outside it: {', '.join(OUTSIDE_EPSILON)}."]
    if seeded:
        notes.append(f"Reproducible noise ({', '.join(seeded)}): dp.reproducible-noise drew the "
                     f"noise and the clients' sample from the run's seed, which its config and "
                     f"checkpoints hold; the epsilon does not hold against anyone who has read "
                     f"the seed.")
    return notes


def summary_cells(s: Mapping[str, float]) -> list[str]:
    """The cells of one :func:`results_table` row (``-`` where nothing was measured)."""
    if not s:
        return ["0", "-", "-", "-", "-", "-", "-", "-", "-"]
    rounds = f"{int(s['steps'])} hops" if s["hops"] else str(int(s["steps"]))
    k, mb = s["work"] / 1000, s["bytes_per_client"] / 1e6  # small runs keep 2 digits, not 0
    work = ("-" if not s["work"] else f"{k:.0f}" if k >= 10 else f"{k:.2g}")
    per_client = ("-" if not np.isfinite(mb) else f"{mb:.1f}" if mb >= 0.1 else f"{mb:.2g}")
    return [rounds, f"{100 * s['final']:.2f}", f"{100 * s['best']:.2f}",
            f"{100 * s['last_mean']:.2f}", f"{100 * s['last_std']:.2f}", work, per_client,
            f"{int(s.get('refused', 0))}", f"{s['time_s']:.0f}"]


def seeds_summary(per_seed: Mapping[int, Sequence[Mapping[str, Any]]], last: int = 10
                  ) -> dict[str, float]:
    """:func:`summarise` of each seed's run, then mean and (sample) std across seeds:
    ``final_mean``, ``final_std``, ``best_mean``, ``best_std``, ``last_mean_mean``,
    ``last_mean_std`` (the last-``last`` mean's spread across seeds), ``last_std_mean``
    (the mean within-run oscillation), ``seeds``, ``rounds``, ``refused`` (the refused or
    missing replies of every seed's run, summed)."""
    rows = [s for recs in per_seed.values() if (s := summarise(recs, last))]
    if not rows:
        return {}
    out: dict[str, float] = {"seeds": float(len(rows)), "rounds": min(r["rounds"] for r in rows),
                             "refused": sum(r.get("refused", 0.0) for r in rows)}
    for key in ("final", "best", "last_mean", "last_std", "time_s"):
        vals = np.asarray([r[key] for r in rows])
        out[f"{key}_mean"] = float(vals.mean())
        out[f"{key}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    return out


#: :func:`verdict`'s answers: the seeds separate a gain from 0; they do not, and the mean
#: difference is a gain, nothing, or a loss (the sign is said: a loss within noise is not a
#: claim that holds); they separate a loss from 0
VERDICTS = ("holds", "within noise, mean for", "within noise", "within noise, mean against",
            "does not hold here")


def verdict(diffs: Sequence[float]) -> str:
    """Whether a claimed gain holds, from paired per-seed differences (method − baseline).

    A paired one-sided t-test at 95 % each way on ``diffs`` (one difference per seed, same
    partition, start and draws for both): ``"holds"`` when the mean difference is
    significantly above 0, ``"does not hold here"`` when it is significantly below 0, and
    when neither (the seeds do not separate the two) ``"within noise, mean for"``,
    ``"within noise, mean against"`` or, for a mean of exactly 0, ``"within noise"``: the
    sign of an unseparated mean is said, never read as the claim holding.  With fewer than
    two seeds there is no spread to judge by, so no verdict.

    Parameters
    ----------
    diffs : sequence of float
        Per-seed differences, any unit.

    Returns
    -------
    str
        One of :data:`VERDICTS`, or ``"one seed: no verdict"``.
    """
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return "one seed: no verdict"
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return VERDICTS[0] if mean > 0 else VERDICTS[4] if mean < 0 else VERDICTS[2]
    from scipy.stats import t as student_t  # scipy comes with dp-accounting; 1-2 s to import

    t = mean / (sd / np.sqrt(d.size))
    crit = float(student_t.ppf(0.95, d.size - 1))  # one-sided 95 % quantile, n - 1 dof
    if t >= crit:
        return VERDICTS[0]
    if t <= -crit:
        return VERDICTS[4]
    return VERDICTS[1] if mean > 0 else VERDICTS[3] if mean < 0 else VERDICTS[2]


def seeds_columns(last: int = 10) -> list[str]:
    """The column names of :func:`seeds_results_table` (and of the terminal's table)."""
    return ["strategy", "seeds", "rounds", "final acc %", "best acc %", f"last-{last} mean %",
            f"last-{last} std (mean over seeds)", "refused replies"]


def seeds_cells(s: Mapping[str, float]) -> list[str]:
    """The cells of one :func:`seeds_results_table` row from :func:`seeds_summary`
    (``-`` where nothing was measured): mean ± std across seeds, accuracy in %."""
    if not s:
        return ["0", "0", "-", "-", "-", "-", "-"]
    return [str(int(s["seeds"])), str(int(s["rounds"])),
            f"{100 * s['final_mean']:.2f} ± {100 * s['final_std']:.2f}",
            f"{100 * s['best_mean']:.2f} ± {100 * s['best_std']:.2f}",
            f"{100 * s['last_mean_mean']:.2f} ± {100 * s['last_mean_std']:.2f}",
            f"{100 * s['last_std_mean']:.2f}", f"{int(s['refused'])}"]


def seeds_results_table(runs: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                        last: int = 10) -> str:
    """A Markdown table over seeds: mean ± std across seeds (accuracy in %)."""
    cols = seeds_columns(last)
    lines = ["| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
    for name, per_seed in runs.items():
        lines.append(f"| {name} | " + " | ".join(seeds_cells(seeds_summary(per_seed, last)))
                     + " |")
    return "\n".join(lines)


LINE_STYLES = ("-", "--", "-.", ":")


def line_style(index: int) -> dict[str, Any]:
    """Matplotlib line keywords for the ``index``-th curve of a figure: the dash pattern
    cycles with the colour, so two methods with the same numbers (FedProx at a small mu
    and FedAvg) still show both curves instead of the later hiding the earlier.  The colour
    is the ``index``-th of matplotlib's cycle, so a method keeps its colour in every figure
    of a setting, also in one where an earlier method draws nothing."""
    return {"lw": 1.6, "ls": LINE_STYLES[index % len(LINE_STYLES)], "color": f"C{index % 10}"}


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend, imported on first use (a run that
    draws nothing does not pay for matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (parents created) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_seed_curves(runs: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]], path: Path,
                     title: str, key: str = "accuracy", scale: float = 100.0,
                     ylabel: str = "test accuracy (%)", xlabel: str = "round") -> Path:
    """A per-round metric's mean across seeds, with a ±1 std band, per strategy.

    Parameters
    ----------
    runs
        Strategy label -> seed -> that seed's per-round records.
    path, title
        Where the PNG goes, and its title.
    key, scale, ylabel, xlabel
        The record key drawn (rounds without it are left out; only the rounds every seed
        reports are drawn), the factor it is drawn at, and the axes' labels.
    """
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, (name, per_seed) in enumerate(runs.items()):
        series = [{int(r["round"]): scale * float(r[key]) for r in recs if key in r}
                  for recs in per_seed.values()]
        rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not rounds:
            continue
        arr = np.asarray([[s[r] for r in rounds] for s in series])
        mean, sd = arr.mean(0), (arr.std(0, ddof=1) if len(arr) > 1 else np.zeros(len(rounds)))
        line = ax.plot(rounds, mean, label=f"{name} ({len(series)} seed{'' if len(series) == 1 else 's'})",
                       marker="o" if len(rounds) <= 3 else None, **line_style(i))[0]
        ax.fill_between(rounds, mean - sd, mean + sd, color=line.get_color(), alpha=0.18)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(fit_title(f"{ylabel}, mean ± std over seeds", 50))
    ax.set_title(fit_title(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def fit_title(title: str, width: int = 80) -> str:
    """``title`` broken into lines of at most ``width`` characters, so a long one is not cut
    off at the figure's edges (a short one is unchanged)."""
    return title if len(title) <= width else textwrap.fill(title, width)


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str) -> Path:
    """Test accuracy of each run, overlaid, as a PNG: against client-training work
    (:func:`work_curve`, so a chain's hops and a parallel method's rounds compare on the
    same effort) when every run reports it, else against the round."""
    plt = pyplot()

    by_work = bool(runs) and all(any(TRAINED_EXAMPLES in r for r in recs)
                                 for recs in runs.values() if recs)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (name, recs) in enumerate(runs.items()):
        pts = ([(w / 1000, 100 * a) for w, a in work_curve(recs)] if by_work else
               [(r["round"], 100 * float(r["accuracy"])) for r in recs if "accuracy" in r])
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, label=name, marker="." if len(xs) <= 40 else None, **line_style(i))
    ax.set_xlabel("client-training work: examples trained by clients so far (thousands)"
                  if by_work else "round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(fit_title(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
