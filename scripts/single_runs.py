"""The tables of the first, single-seed reproductions (FedCDA, FedCross, IMA): the typed
descriptions (:class:`RunsPage`, :class:`Table`, :class:`Plot`) that the pages' data,
``docs/results/pages/<page>.yaml``, is read into by ``scripts/report.py``, and their
rendering (issue 43 item 3).

Their runs (``python scripts/reproduce.py singles``) are ``runs/<run>/<strategy>/``, their
records ``docs/results/data/<run>.jsonl`` (all strategies of a run in one file,
:func:`fedsys_launch.recording.kept_records`).  Each :class:`Table` is written between the lines
``<!-- report: KEY -->`` and ``<!-- /report -->`` of its page, so the prose around it stays
the page author's; each :class:`Plot` is drawn from the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsys import metrics
from fedsys_launch import recording

Records = list[dict[str, Any]]
#: a table row's sources: (run, strategy) each
Sources = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Table:
    """One generated table of a single-run page.

    Attributes
    ----------
    key : str
        Its marker on the page (``<!-- report: KEY -->``).
    kind : str
        How rows become cells: a key of :data:`KINDS`.
    rows : Mapping[str, Sources]
        Row label -> the (run, strategy) records it reads (two for a paired row).
    extra : Mapping[str, tuple[str, ...]]
        Row label -> cells copied as given (a paper's numbers).
    targets : tuple of float
        The accuracies (%) a "reach" table counts the first round of.
    spread : bool
        A "summary" table's column of FedCross's slot spread after the last round.
    """

    key: str
    kind: str
    rows: Mapping[str, Sources]
    extra: Mapping[str, tuple[str, ...]] | None = None
    targets: tuple[float, ...] = ()
    spread: bool = False


@dataclass(frozen=True)
class Plot:
    """One figure of a single-run page: accuracy per round of ``curves`` (label -> (run,
    strategy)) from round ``first`` on."""

    file: str
    title: str
    curves: Mapping[str, tuple[str, str]]
    first: int = 0


@dataclass(frozen=True)
class RunsPage:
    """The generated parts of ``docs/results/<doc>.md`` from single runs."""

    doc: str
    tables: tuple[Table, ...]
    plots: tuple[Plot, ...] = ()


def minus(x: float) -> str:
    """A signed number with a typographic minus (U+2212), as the pages print differences."""
    return f"{x:+.2f}".replace("-", "\u2212")


def first_reach(recs: Records, target: float) -> str:
    """The first round at ``target`` % accuracy or above, ``"-"`` if never."""
    hit = [int(r["round"]) for r in recs if r["round"] > 0 and 100 * r["accuracy"] >= target - 1e-9]
    return str(hit[0]) if hit else "-"


def at_round(recs: Records, rnd: int) -> str:
    hit = [r for r in recs if r["round"] == rnd]
    return f"{100 * hit[0]['accuracy']:.2f}" if hit else "-"


def pm(s: Mapping[str, float], sep: str = " ± ") -> str:
    return f"{100 * s['last_mean']:.2f}{sep}{100 * s['last_std']:.2f}"


def summary(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """FedCross's table: rounds, final, last-10 mean ± std, best, first round at 60 / 70 %
    (and, with ``spread``, the ``fedcross-slot-spread`` of the last round)."""
    spread = t.spread
    rows = ["| method | rounds | final % | last-10 mean ± std % | best % | round >= 60 % | "
            "round >= 70 %" + (" | slot spread, last round |" if spread else " |"),
            "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if spread else "")]
    for label, (r,) in recs.items():
        s = metrics.summarise(r, 10)
        row = (f"| {label} | {int(s['rounds'])} | {100 * s['final']:.2f} | {pm(s)} | "
               f"{100 * s['best']:.2f} | {first_reach(r, 60)} | {first_reach(r, 70)} |")
        if spread:
            v = r[-1].get("fedcross-slot-spread")
            row += f" {v:.3f} |" if v is not None else " - |"
        rows.append(row)
    return rows


def early(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """The accelerations' table: accuracy at rounds 10, 20, 30, the mean of rounds 1-30, the
    first round at 60 %, final and last-10."""
    rows = ["| method | round 10 % | round 20 % | round 30 % | mean of rounds 1-30 % | "
            "round >= 60 % | final % | last-10 mean ± std % |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, (r,) in recs.items():
        s = metrics.summarise(r, 10)
        first = [x["accuracy"] for x in r if 1 <= x["round"] <= 30]
        rows.append(f"| {label} | {at_round(r, 10)} | {at_round(r, 20)} | {at_round(r, 30)} | "
                    f"{100 * sum(first) / max(1, len(first)):.2f} | {first_reach(r, 60)} | "
                    f"{100 * s['final']:.2f} | {pm(s)} |")
    return rows


def paper(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """FedCDA's Table 1 beside ours: per partition FedAvg and FedCDA (last-10 mean ± std),
    the gain, the std ratio, the paper's two numbers, the rounds each ran."""
    rows = ["| partition | FedAvg (ours) | FedCDA (ours) | gain | std ratio FedAvg/FedCDA "
            "| FedAvg (paper) | FedCDA (paper) | rounds done |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, (avg, cda) in recs.items():
        a, c = metrics.summarise(avg, 10), metrics.summarise(cda, 10)
        theirs = (t.extra or {})[label]
        rows.append(f"| {label} | {pm(a, '±')} | {pm(c, '±')} | "
                    f"{minus(100 * (c['last_mean'] - a['last_mean']))} | "
                    f"{a['last_std'] / c['last_std']:.1f} | {' | '.join(theirs)} | "
                    f"{int(a['rounds'])}/{int(c['rounds'])} |")
    return rows


def selection(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """FedCDA's aggregation ablation: last-10, final, and how many of a round's participants
    had a model of an earlier round selected (``fedcda-earlier-models``, after the warm-up)."""
    rows = ["| aggregation | last-10 mean ± std % | final % | participants per round whose "
            "selected model is from an earlier round |", "|---|---:|---:|---:|"]
    for label, (r,) in recs.items():
        s = metrics.summarise(r, 10)
        old = [x["fedcda-earlier-models"] for x in r if x.get("fedcda-warmup") == 0.0]
        per = int(r[-1].get("clients-ok", 0))
        cell = f"{sum(old) / len(old):.2f} of {per}" if old else "-"
        rows.append(f"| {label} | {pm(s, '±')} | {100 * s['final']:.2f} | {cell} |")
    return rows


def with_gain(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """IMA's table: final, last-10 mean ± std, best, and the final-round gain of a ``+IMA``
    row over its base's row."""
    rows = ["| method | final % | last-10 mean ± std % | best % | final gain from IMA |",
            "|---|---:|---:|---:|---:|"]
    final = {k: 100 * float(r[-1]["accuracy"]) for k, (r,) in recs.items()}
    for label, (r,) in recs.items():
        s = metrics.summarise(r, 10)
        base = label.removesuffix("+IMA")
        gain = f" {final[label] - final[base]:+.2f} " if base != label and base in final else " "
        rows.append(f"| {label} | {final[label]:.2f} | {pm(s)} | {100 * s['best']:.2f} |{gain}|")
    return rows


def reach(t: Table, recs: Mapping[str, list[Records]]) -> list[str]:
    """The first round each row reaches each of ``targets`` (the IMA paper's Table II)."""
    rows = ["| method | " + " | ".join(f"{x:g} %" for x in t.targets) + " |",
            "|---|" + "---:|" * len(t.targets)]
    for label, (r,) in recs.items():
        rows.append(f"| {label} | " + " | ".join(first_reach(r, x) for x in t.targets) + " |")
    return rows


KINDS: dict[str, Callable[[Table, Mapping[str, list[Records]]], list[str]]] = {
    "summary": summary, "early": early, "paper": paper, "selection": selection,
    "with-gain": with_gain, "reach": reach}


def records(runs: Path, data: Path, sources: Sources) -> list[Records]:
    """The records of ``sources``, from ``runs`` (copied to ``data``) or from ``data``."""
    return [recording.kept_records(runs, data, run, strategy) for run, strategy in sources]


def render(table: Table, runs: Path, data: Path) -> str:
    """``table`` as Markdown; a row whose records are missing says so."""
    got = {label: records(runs, data, src) for label, src in table.rows.items()}
    missing = [label for label, recs in got.items() if not all(recs)]
    done = {label: recs for label, recs in got.items() if label not in missing}
    lines = KINDS[table.kind](table, done)
    if missing:
        lines += ["", f"(not run: {', '.join(missing)})"]
    return "\n".join(lines)


def draw(plot: Plot, runs: Path, data: Path, out: Path) -> Path:
    curves = {label: [r for r in recording.kept_records(runs, data, run, strategy)
                      if r["round"] >= plot.first]
              for label, (run, strategy) in plot.curves.items()}
    return metrics.plot_curves({k: v for k, v in curves.items() if v}, out / plot.file, plot.title)


def replace_block(text: str, key: str, body: str) -> str:
    """``text`` with the lines between ``<!-- report: KEY -->`` and the next
    ``<!-- /report -->`` set to ``body``."""
    head = f"<!-- report: {key} -->"
    lines = text.split("\n")
    if head not in lines:
        raise SystemExit(f"report: the page has no line {head!r} to write table {key!r} under")
    start = lines.index(head)
    try:
        end = lines.index("<!-- /report -->", start)
    except ValueError:
        raise SystemExit(f"report: table {key!r} has no closing <!-- /report --> line") from None
    return "\n".join([*lines[:start + 1], *body.split("\n"), *lines[end:]])


def write(page: RunsPage, runs: Path, out: Path, plots: bool) -> str:
    """Rewrite ``page``'s tables (and, with ``plots``, its figures) under ``out``; the tables."""
    data = out / "data"
    doc = out / f"{page.doc}.md"
    text = doc.read_text()
    bodies = []
    for table in page.tables:
        body = render(table, runs, data)
        text = replace_block(text, table.key, body)
        bodies.append(body)
    doc.write_text(text)
    for plot in page.plots if plots else ():
        draw(plot, runs, data, out)
    return "\n\n".join(bodies)
