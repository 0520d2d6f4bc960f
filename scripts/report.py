"""The one report tool of docs/results/ (issue 43 item 3): every generated table and figure
of the results pages, from the records in ``docs/results/data/``, each page driven by a typed
description kept as data, ``docs/results/pages/<page>.yaml`` (:func:`load_pages`: a
:class:`Page` for a group of runs across seeds, a :class:`single_runs.RunsPage` for the first,
single-seed reproductions; issue 66 item 5).

The runs are made by ``scripts/reproduce.py`` (which calls this after each seed).  For a
group across seeds it reads ``runs/<group>/<setting>/seed-<k>/<strategy>/metrics.jsonl`` of
finished runs, copies each to ``docs/results/data/<group>-<setting>-s<k>-<strategy>.jsonl``
(``runs/`` is not kept between machines; a run whose directory is gone is read back from
there; a run with refused replies is not copied but moved aside, to be run again: see
:func:`collect`), and writes the page's generated section: per setting, every strategy's
accuracy as mean ± std across seeds (and each seed's) at the page's points, the curves (mean
across seeds, ±1 std band), and where a page lists the paper's claims, each judged on the
seeds: "holds", "within noise" (with the sign of the mean difference) or "does not hold
here" (:func:`claims_table`).

Usage::

    python scripts/report.py GROUP ... | all [--runs DIR] [--out docs/results] [--no-plots]
    python scripts/report.py --check     # every page regenerated from docs/results/data
                                         # into a copy: byte-identical, or the differences

GROUP is one of :data:`PAGES` (``fedcda-seeds``, ...), of :data:`RUN_PAGES`
(``fedcda-runs``, ``fedcross-runs``, ``ima-runs``) or of :data:`ARCHIVE_ONLY` (records kept,
no page).  ``--runs`` defaults to ``runs/<group>`` (single runs: ``runs``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import asdata  # noqa: E402
import single_runs  # noqa: E402

from fedsys import metrics  # noqa: E402
from fedsys_launch import recording  # noqa: E402


class Claim(NamedTuple):
    """A paper's claim judged on the seeds (:func:`claims_table`): ``method`` in ``setting``
    against ``baseline`` in ``baseline_setting`` on ``statistic``, the claim holding when
    the method's is above (``direction`` ``">"``) or below (``"<"``) the baseline's."""

    claim: str
    setting: str
    method: str
    baseline_setting: str
    baseline: str
    statistic: str
    direction: str



#: Strategy (a run's results directory) -> how the page names it.
Names = Mapping[str, str]


@dataclass(frozen=True)
class Page:
    """What one generated section of a results page shows, for one group of runs
    (``runs/<group>/<setting>/seed-<k>/<strategy>/``).

    Attributes
    ----------
    points : tuple
        The accuracy points of the tables: a round, ``"final"`` or ``"last10"``.
    settings : Mapping[str, str]
        Setting -> its title, in the page's order; runs of other settings are not read.
    names : Names
        How the tables name each strategy.
    xlabel : str
        The curves' x axis.
    doc, section : str
        The page (``docs/results/<doc>.md``, default: the group's name) and the section
        the generated text replaces.
    config : str or Mapping[str, str]
        The command or preset behind each setting (``{setting}`` filled in), or one per
        setting.
    claims : tuple of Claim
        The paper's claims, judged on the seeds.
    baseline : tuple
        (baseline strategy, baseline setting -> the settings compared with it): paired
        tables against one baseline (:func:`paired`).
    pairs : tuple
        Named comparisons (setting, strategy, baseline's setting, baseline), possibly
        across settings (:func:`paired_table`).
    paired : str, optional
        A baseline in every setting, compared on the same seed.
    means : Mapping[str, str]
        Round metrics averaged from round ``means_from`` on (key -> label), with curves.
    regime : tuple of (str, str), optional
        (method, its warm-up key): the regime table (:func:`regime_table`).
    windows : Mapping[str, tuple]
        Setting -> windows of rounds (:func:`windows_table`).
    matrix : tuple of str
        Settings shown as the columns of one table per statistic instead of a table each,
        the first the reference the others are paired with (:func:`matrix_tables`).
    finals : Mapping[str, str]
        Round metrics shown at the final round beside the accuracy (key -> label).
    refusals_expected : bool
        Refused replies are the experiment (attackers): such runs are archived, not redone.
    """

    points: tuple[int | str, ...]
    settings: Mapping[str, str]
    names: Names
    xlabel: str = "round"
    doc: str = ""
    section: str = "## Measured (generated)"
    config: str | Mapping[str, str] = ""
    claims: tuple[Claim, ...] = ()
    baseline: tuple[tuple[str, Mapping[str, tuple[str, ...]]], ...] = ()
    pairs: tuple[tuple[str, str, str, str], ...] = ()
    paired: str | None = None
    means: Mapping[str, str] = field(default_factory=dict)
    means_from: int = 1
    regime: tuple[str, str] | None = None
    windows: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    matrix: tuple[str, ...] = ()
    finals: Mapping[str, str] = field(default_factory=dict)
    refusals_expected: bool = False

    def source(self, group: str, setting: str) -> str:
        """The command or preset behind ``setting``."""
        c = self.config or f"configs/{group}-{{setting}}.yaml"
        return (c if isinstance(c, str) else c[setting]).format(group=group, setting=setting)


#: The results pages' descriptions: ``docs/results/pages/<page>.yaml``, one entry per group.
PAGE_DIR = ROOT / "docs" / "results" / "pages"


def load_pages(where: Path = PAGE_DIR) -> tuple[dict[str, Page], dict[str, single_runs.RunsPage]]:
    """Every page's groups: those across seeds (:class:`Page`) and those of single runs
    (an entry with ``tables``: :class:`single_runs.RunsPage`), each written into the page
    its file names (``<page>.yaml``: ``docs/results/<page>.md``)."""
    seeds: dict[str, Page] = {}
    singles: dict[str, single_runs.RunsPage] = {}
    for path in sorted(where.glob("*.yaml")):
        for group, spec in asdata.read(path, dict).items():
            kind: Any = single_runs.RunsPage if "tables" in spec else Page
            got = asdata.load(kind, {**spec, "doc": path.stem}, f"{path.name}: {group}")
            if group in seeds or group in singles:
                raise asdata.DataError(f"{path.name}: group {group!r} is described twice")
            (singles if "tables" in spec else seeds)[group] = got
    return seeds, singles


try:
    PAGES, RUN_PAGES = load_pages()
except asdata.DataError as exc:  # a page file written wrong: one line naming it, run as a script
    if __name__ == "__main__":
        sys.exit(f"report: {exc}")
    raise
HEADS = {"final": "final", "last10": "last-10 mean"}

Runs = dict[str, dict[str, dict[int, list[dict[str, Any]]]]]  # setting -> strategy -> seed -> recs


def refused(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rounds' records in which replies were refused or missing (``clients-rejected`` > 0)."""
    return [r for r in recs if float(r.get("clients-rejected", 0)) > 0]


def collect(runs: Path, data: Path, group: str, settings: Mapping[str, str],
            keep_refused: bool = False) -> Runs:
    """Every run's records of ``group`` in ``settings``, from ``runs`` (copied to ``data``)
    or from ``data``.

    A finished run with refused or missing replies is not the experiment as configured
    (every client replies in a simulation unless the machine stalls it past
    ``round-timeout``): it is not archived but moved aside to ``<strategy>.refused-<n>``,
    so that running the seed again redoes it from the start; unless ``keep_refused``
    (attackers' replies are meant to be refused).
    """
    out: Runs = {}
    for f in sorted(runs.glob("*/seed-*/*/metrics.jsonl")):
        setting, seed, strategy = f.parts[-4], int(f.parts[-3].split("-")[1]), f.parts[-2]
        if ".refused-" in strategy:  # set aside before
            continue
        recs = metrics.read_jsonl(f)
        if not recs or not (f.parent / "model.pt").exists():  # finished runs only
            continue
        if (bad := [int(r["round"]) for r in refused(recs)]) and not keep_refused:
            n = len(list(f.parent.parent.glob(f"{strategy}.refused-*")))
            aside = f.parent.with_name(f"{strategy}.refused-{n + 1}")
            f.parent.rename(aside)
            print(f"report: {f.parent} refused replies in rounds {bad}: not archived, "
                  f"moved to {aside.name}; run the seed again", file=sys.stderr)
            continue
        metrics.write_jsonl(data / f"{group}-{setting}-s{seed}-{strategy}.jsonl", recs)
    for f in sorted(data.glob(f"{group}-*-s*-*.jsonl")):
        m = re.fullmatch(rf"{re.escape(group)}-(.+?)-s(\d+)-(.+)\.jsonl", f.name)
        if m and m.group(1) in settings:
            out.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = \
                metrics.read_jsonl(f)
    return out


def at(recs: list[dict[str, Any]], point: int | str, key: str = "accuracy") -> float | None:
    """``key`` after round ``point`` (``"final"``: the last evaluated; ``"last10"``: the
    mean of the last 10 evaluated), in %."""
    vals = [(int(r["round"]), r[key]) for r in recs if key in r and r["round"] > 0]
    if not vals:
        return None
    if point == "final":
        return 100 * float(vals[-1][1])
    if point == "last10":
        return 100 * statistics.mean(float(v) for _, v in vals[-10:])
    hit = [v for rnd, v in vals if rnd == point]
    return 100 * float(hit[0]) if hit else None


def last(recs: list[dict[str, Any]], points: Sequence[int | str], key: str) -> float | None:
    """``key`` at the latest of ``points`` the run reached."""
    vals = [v for p in points if (v := at(recs, p, key)) is not None]
    return vals[-1] if vals else None


def stat(values: list[float], mean_fmt: str = ".2f", sd_fmt: str = ".2f",
         empty: str = "(not run)") -> str:
    """``mean ± std (n)`` (``empty`` for no values)."""
    if not values:
        return empty
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{mean_fmt}} ± {sd:{sd_fmt}} (n={len(values)})"


def table(runs: Runs, setting: str, points: tuple[int | str, ...], names: Names,
          key: str = "accuracy", finals: Mapping[str, str] | None = None) -> str:
    """One setting's strategies: mean ± std across seeds at each point (and of each of
    ``finals``' round metrics at the final round), each seed's value."""
    heads = [HEADS.get(str(p), f"after round {p}") for p in points]
    more = dict(finals or {})
    rows = ["| method | " + " | ".join([*(f"{h} %, mean ± std" for h in heads),
                                        *(f"final {label}" for label in more.values())])
            + " | per seed | rounds |",
            "|---|" + "---:|" * (len(points) + len(more)) + "---|---:|"]
    for strategy, seeds in runs.get(setting, {}).items():
        cells = [stat([v for r in seeds.values() if (v := at(r, p, key)) is not None])
                 for p in points]
        cells += [stat([float(r[-1][k]) for r in seeds.values() if r and k in r[-1]],
                       empty="-") for k in more]
        per = ", ".join(f"s{s}: {v:.2f}" for s, r in sorted(seeds.items())
                        if (v := last(r, points, key)) is not None)
        steps = max((int(r[-1]["round"]) for r in seeds.values() if r), default=0)
        rows.append(f"| {names.get(strategy, strategy)} | " + " | ".join(cells) +
                    f" | {per} | {steps} |")
    return "\n".join(rows)


def refusals(runs: Runs, setting: str, names: Names | None = None) -> str:
    """The rounds of ``setting`` in which replies were refused or missing
    (``clients-rejected`` > 0), one entry per seed and strategy, so a reader sees which
    numbers rest on fewer clients than the round asked; ``""`` when there are none."""
    hits = []
    for strategy, seeds in runs.get(setting, {}).items():
        for seed, recs in sorted(seeds.items()):
            bad = [f"round {int(r['round'])} ({int(r['clients-rejected'])} of "
                   f"{int(r['clients-rejected'] + r.get('clients-ok', 0))})"
                   for r in refused(recs)]
            if bad:
                hits.append(f"{(names or {}).get(strategy, strategy)} s{seed}: {', '.join(bad)}")
    if not hits:
        return ""
    return ("**Refused or missing replies** (that round's update rests on fewer clients; "
            "the reasons are in the run's log): " + "; ".join(hits) + ".\n")


def paired(runs: Runs, points: tuple[int | str, ...], base: str,
           groups: Mapping[str, tuple[str, ...]], names: Names) -> str:
    """Each method minus ``base`` of the same seed (same partition, start and draws) in
    the baseline's setting (``groups``: baseline setting -> settings compared with it),
    mean ± std of the per-seed differences, in points."""
    pairs = [(setting, strategy, base_setting, base)
             for base_setting, settings in groups.items() for setting in settings
             for strategy in runs.get(setting, {}) if strategy != base]
    return paired_table(runs, points, pairs, names, f"against {names.get(base, base)}")


def paired_table(runs: Runs, points: tuple[int | str, ...],
                 pairs: tuple[tuple[str, str, str, str], ...] | list[tuple[str, str, str, str]],
                 names: Names, against: str = "") -> str:
    """The paired table of ``pairs``: (setting, strategy, baseline's setting, baseline),
    each the strategy minus its baseline on the same seed, mean ± std across seeds, with
    the verdict on the last point.  Without ``against`` (one baseline for all) a row names
    its own baseline."""
    heads = [HEADS.get(str(p), f"round {p}") for p in points]
    rows = [f"### Paired differences{' ' + against if against else ''}, same seed\n",
            "Each method's accuracy minus the baseline's on the same seed and start, in "
            "points (mean ± std of the per-seed differences; the seed moves both together, "
            "so this is tighter than comparing the two means).  The verdict judges the "
            f"{heads[-1]} difference by a paired one-sided t-test at 95 % each way "
            "(`fedsys.metrics.verdict`): \"holds\" is a gain the seeds separate from 0, "
            "\"does not hold here\" a loss they separate from 0, \"within noise\" "
            "neither, with the sign of the mean difference (\"mean for\": a gain, "
            "\"mean against\": a loss):\n",
            "| setting | method | " + " | ".join(f"{h}, difference" for h in heads)
            + " | verdict |",
            "|---|---|" + "---:|" * len(points) + "---|"]
    for setting, strategy, base_setting, base in pairs:
        seeds = runs.get(setting, {}).get(strategy)
        if seeds is None:
            continue
        ref = runs.get(base_setting, {}).get(base, {})
        cells, d = [], []
        for p in points:
            d = [v - b for k, r in seeds.items() if k in ref
                 and (v := at(r, p)) is not None and (b := at(ref[k], p)) is not None]
            cells.append(stat(d) if d else "(not run)")
        label = names.get(strategy, strategy)
        if not against:
            label += f" − {names.get(base, base)}"
        rows.append(f"| {setting} | {label} | " + " | ".join(cells)
                    + f" | {metrics.verdict(d) if d else '-'} |")
    return "\n".join(rows) + "\n"


#: a claim's statistic of one run's accuracy, in points: "final", "last10" (see :func:`at`),
#: "last10-std" (the std of the last 10 evaluated rounds: how much the curve still swings),
#: "rounds:A-B" (the mean over rounds A to B: how fast it starts), "rounds-to:X" (the first
#: round whose accuracy is X % or more: how soon it gets there), "round:N" (the accuracy
#: after round N), "gain:A-B" (the accuracy after round B minus after round A: how much a
#: method still gains)
STATISTICS = {"final": "final accuracy", "last10": "last-10 mean",
              "last10-std": "last-10 std (swing)"}


def measure(recs: list[dict[str, Any]], statistic: str) -> float | None:
    """``statistic`` (one of :data:`STATISTICS`, ``"rounds:A-B"``, ``"rounds-to:X"``,
    ``"round:N"`` or ``"gain:A-B"``) of a run's accuracy, in % (a gain in points)."""
    if statistic in ("final", "last10"):
        return at(recs, statistic)
    if m := re.fullmatch(r"round:(\d+)", statistic):
        return at(recs, int(m.group(1)))
    if m := re.fullmatch(r"gain:(\d+)-(\d+)", statistic):
        a, b = at(recs, int(m.group(1))), at(recs, int(m.group(2)))
        return None if a is None or b is None else b - a
    if m := re.fullmatch(r"rounds:(\d+)-(\d+)", statistic):
        return window_mean(recs, "accuracy", int(m.group(1)), int(m.group(2)), 100)
    if m := re.fullmatch(r"rounds-to:(\d+(?:\.\d+)?)", statistic):
        return first_round(recs, float(m.group(1)))
    if statistic == "last10-std":
        vals = [100 * float(r["accuracy"]) for r in recs if "accuracy" in r and r["round"] > 0]
        return statistics.stdev(vals[-10:]) if len(vals) >= 10 else None
    raise ValueError(f"unknown statistic {statistic!r}")


def first_round(recs: list[dict[str, Any]], target: float) -> float | None:
    """The first round whose accuracy is ``target`` % or more; a run that never gets there
    counts as its last round + 1 (a lower bound: it would have needed at least that many),
    so a seed that misses the target is not dropped from the comparison."""
    vals = [(int(r["round"]), 100 * float(r["accuracy"])) for r in recs
            if "accuracy" in r and r["round"] > 0]
    if not vals:
        return None
    return float(next((rnd for rnd, v in vals if v >= target - 1e-9), vals[-1][0] + 1))


def claims_table(runs: Runs, claims: tuple[Claim, ...], names: Names) -> str:
    """The paper's claims, each judged on the seeds: (claim, setting, method, baseline's
    setting, baseline, statistic, ``">"`` or ``"<"``: the method's statistic claimed above or
    below the baseline's).  Each row gives both sides (mean ± std across seeds), their
    per-seed difference, and :func:`fedsys.metrics.verdict` on that difference taken in the
    claimed direction."""
    rows = ["### The paper's claims, judged on the seeds\n",
            "Each claim compares a method with a baseline on the same seeds (same partition, "
            "start and draws). The verdict is a paired one-sided t-test at 95 % each way on "
            "the per-seed difference taken in the claimed direction "
            "(`fedsys.metrics.verdict`): \"holds\" when the seeds separate the claimed "
            "difference from 0, \"does not hold here\" when they separate the opposite, "
            "\"within noise\" when neither, with the sign of the mean difference "
            "(\"mean for\": in the claimed direction, \"mean against\": opposite).\n",
            "| the paper's claim | setting | statistic | method | baseline | "
            "method − baseline, per seed | verdict |",
            "|---|---|---|---:|---:|---:|---|"]
    for claim, setting, strategy, base_setting, base, statistic, sign in claims:
        seeds = runs.get(setting, {}).get(strategy, {})
        ref = runs.get(base_setting, {}).get(base, {})
        mine = {k: v for k, r in seeds.items() if (v := measure(r, statistic)) is not None}
        theirs = {k: v for k, r in ref.items() if (v := measure(r, statistic)) is not None}
        d = [mine[k] - theirs[k] for k in sorted(mine) if k in theirs]
        judged = metrics.verdict([x if sign == ">" else -x for x in d]) if d else "(not run)"
        kind, _, arg = statistic.partition(":")
        label = STATISTICS.get(statistic) or {
            "rounds-to": f"first round at {arg} % (never: last + 1)",
            "round": f"accuracy after round {arg}",
            "gain": f"accuracy gain over rounds {arg} (points)",
        }.get(kind, f"mean of rounds {arg}")
        rows.append(f"| {claim} | {setting} | {label}, claimed {sign} | "
                    f"{names.get(strategy, strategy)}: {stat(list(mine.values()), empty='-')} | "
                    f"{names.get(base, base)}: {stat(list(theirs.values()), empty='-')} | "
                    f"{stat(d, empty='-')} | {judged} |")
    return "\n".join(rows) + "\n"


def window_mean(recs: list[dict[str, Any]], key: str, lo: int, hi: int,
                scale: float = 1.0) -> float | None:
    """``key`` averaged over rounds ``lo`` to ``hi`` (None: the run did not reach ``hi``
    or never logged ``key`` there)."""
    vals = [scale * float(r[key]) for r in recs if lo <= r["round"] <= hi and key in r]
    return statistics.mean(vals) if vals and recs[-1]["round"] >= hi else None


def windows_table(runs: Runs, setting: str, windows: tuple[tuple[int, int], ...], base: str,
                  keys: Mapping[str, str], names: Names) -> str:
    """Per window of rounds, each strategy's mean accuracy minus ``base``'s on the same
    seed, and the round metrics ``keys`` averaged over the window (mean ± std across seeds):
    whether a gap closes as, say, FedCross's slots settle."""
    others = [s for s in runs.get(setting, {}) if s != base]
    ref = runs.get(setting, {}).get(base, {})
    heads = [f"{names.get(s, s)} − {names.get(base, base)}, accuracy points" for s in others]
    logged = [(k, s) for k in keys for s in others
              if any(k in r for recs in runs[setting][s].values() for r in recs)]
    heads += [f"{keys[k]}, {names.get(s, s)}" for k, s in logged]
    rows = ["| rounds | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for lo, hi in windows:
        cells = []
        for s in others:
            d = [v - b for k, recs in runs[setting][s].items() if k in ref
                 and (v := window_mean(recs, "accuracy", lo, hi, 100)) is not None
                 and (b := window_mean(ref[k], "accuracy", lo, hi, 100)) is not None]
            cells.append(stat(d, empty="-"))
        for k, s in logged:
            cells.append(stat([v for recs in runs[setting][s].values()
                               if (v := window_mean(recs, k, lo, hi)) is not None],
                              ".4g", ".2g", "-"))
        rows.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    return ("Mean over each window of rounds, per seed, then mean ± std across seeds "
            "(differences paired by seed):\n\n" + "\n".join(rows) + "\n")


def mean_from(recs: list[dict[str, Any]], key: str, first: int) -> float | None:
    """``key`` averaged over rounds ``first`` onwards (None: the run never logged it)."""
    return window_mean(recs, key, first, int(recs[-1]["round"])) if recs else None


def means(runs: Runs, setting: str, keys: Mapping[str, str], first: int, names: Names,
          base: str | None = None) -> str:
    """Round metrics averaged over rounds ``first`` onwards, per seed, then mean ± std
    across seeds; with ``base``, each metric the baseline logs also as a ratio to the
    baseline's on the same seed."""
    ref = runs.get(setting, {}).get(base or "", {})
    ratio_keys = [k for k in keys if any(mean_from(r, k, first) is not None for r in ref.values())]
    heads = [f"{v}, mean of rounds {first}+" for v in keys.values()]
    heads += [f"{keys[k]}, ratio to {names.get(base or '', base)} (same seed)" for k in ratio_keys]
    rows = ["| method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for strategy, seeds in runs.get(setting, {}).items():
        cells = []
        for k in keys:
            per = [v for recs in seeds.values() if (v := mean_from(recs, k, first)) is not None]
            cells.append(stat(per, ".4g", ".2g", "-"))
        for k in ratio_keys:
            rat = [v / b for s, recs in seeds.items() if s in ref
                   and (v := mean_from(recs, k, first)) is not None
                   and (b := mean_from(ref[s], k, first))]
            cells.append(stat(rat, ".4g", ".2g", "-"))
        rows.append(f"| {names.get(strategy, strategy)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def warmup_end(recs: list[dict[str, Any]], key: str) -> int | None:
    """The last round whose record marks it as warmup (``key`` true), None if none does."""
    marked = [int(r["round"]) for r in recs if r.get(key)]
    return max(marked) if marked else None


def regime_table(runs: Runs, method: str, base: str, warmup_key: str, keys: Mapping[str, str],
                 first: int, names: Names, settings: Mapping[str, str]) -> str:
    """One row per setting: where ``method``'s gain over ``base`` holds and why.

    The paired last-10 difference and its verdict; the accuracy when ``method``'s warmup
    (read from the records: the last round with ``warmup_key`` true) ends, and how much each
    strategy gains after it (last-10 mean minus that accuracy, per seed); and the round
    metrics ``keys`` averaged over rounds ``first`` onwards (``method``'s, and its ratio to the
    base's where the base logs the metric too); and how much less ``method`` swings (the base's
    last-10 std over ``method``'s).  All mean ± std across seeds."""
    m, b = names.get(method, method), names.get(base, base)
    ratio = {k: any(mean_from(r, k, first) is not None
                    for s in runs.values() for r in s.get(base, {}).values()) for k in keys}
    heads = [f"{m} − {b}, last-10 mean (paired): per seed", "verdict",
             "accuracy when the warmup ends (round)", f"{b}'s gain after the warmup",
             f"{m}'s gain after the warmup"]
    heads += [f"{keys[k]}, {m} (× {b}'s)" if ratio[k] else f"{keys[k]}, {m}" for k in keys]
    heads.append(f"last-10 std, {b}'s / {m}'s")
    rows = ["| setting | " + " | ".join(heads) + " |", "|---|---:|---|" + "---:|" * (len(heads) - 2)]
    for setting in [s for s in settings if s in runs] or list(runs):
        mine, ref = runs[setting].get(method, {}), runs[setting].get(base, {})
        seeds = sorted(k for k in mine if k in ref)
        if not seeds:
            continue
        d = [v - w for k in seeds
             if (v := at(mine[k], "last10")) is not None and (w := at(ref[k], "last10")) is not None]
        ends = {k: w for k in seeds if (w := warmup_end(mine[k], warmup_key)) is not None}
        start = {k: v for k, w in ends.items() if (v := at(mine[k], w)) is not None}
        gains = [stat([v - start[k] for k in start if (v := at(runs_k[k], "last10")) is not None])
                 for runs_k in (ref, mine)]
        rounds = "/".join(str(w) for w in sorted(set(ends.values()))) or "-"
        per_seed = ", ".join(f"{x:+.2f}" for x in d)
        cells = [f"{stat(d, empty='-')}: {per_seed}" if d else "-", metrics.verdict(d) if d else "-",
                 f"{stat(list(start.values()), empty='-')} (round {rounds})", *gains]
        for k in keys:
            own = stat([v for s in seeds if (v := mean_from(mine[s], k, first)) is not None],
                       ".3g", ".2g", "-")
            times = [v / w for s in seeds if (v := mean_from(mine[s], k, first)) is not None
                     and (w := mean_from(ref[s], k, first))]
            cells.append(f"{own} (× {stat(times, '.3g', '.2g')})" if ratio[k] else own)
        swing = [w / v for s in seeds if (v := measure(mine[s], "last10-std"))
                 and (w := measure(ref[s], "last10-std")) is not None]
        cells.append(stat(swing, ".3g", ".2g", "-"))
        rows.append(f"| {setting} | " + " | ".join(cells) + " |")
    return (f"### Where the gain holds, and why (rounds {first}+ for the round metrics)\n\n"
            f"Per seed, then mean ± std across seeds; differences and ratios paired by seed. "
            f"{m}'s warmup runs {b}, so both start from the same model when it ends; the gains "
            f"are each strategy's last-10 mean minus that accuracy.\n\n" + "\n".join(rows) + "\n")


def curves(runs: Runs, setting: str, path: Path, title: str, names: Names, xlabel: str,
           key: str = "accuracy", ylabel: str = "test accuracy (%)", scale: float = 100.0,
           plot: bool = True) -> Path:
    """``key`` (accuracy: after every hop of a chain and after the parallel round) per
    round of ``setting``, mean across seeds with a ±1 std band (:func:`metrics.plot_seed_curves`)."""
    if not plot:
        return path
    named = {names.get(strategy, strategy): seeds
             for strategy, seeds in runs.get(setting, {}).items()}
    return metrics.plot_seed_curves(named, path, title, key=key, scale=scale, ylabel=ylabel,
                                    xlabel=xlabel)


def matrix_tables(runs: Runs, page: Page, group: str, out: Path, plot: bool = True) -> str:
    """The settings of ``page.matrix`` as columns: final accuracy (mean ± std across
    seeds), its change against the first setting on the same seed (the same partitions,
    draws and honest clients), and the replies refused per run; one figure per setting."""
    cols = [c for c in page.matrix if c in runs]
    if not cols:
        return ""
    ref = runs[page.matrix[0]] if page.matrix[0] in runs else {}
    found = {s for c in cols for s in runs[c]}  # in the page's order, then any other
    strategies = [s for s in page.names if s in found] + sorted(found - set(page.names))
    head = "| method | " + " | ".join(page.settings[c] for c in cols) + " |\n|---|" + \
        "---:|" * len(cols)

    def grid(cell: Any) -> str:
        return head + "\n" + "\n".join(
            f"| {page.names.get(s, s)} | " + " | ".join(cell(c, s, runs[c].get(s, {}))
                                                        for c in cols) + " |"
            for s in strategies)

    def final(c: str, s: str, seeds: dict[int, list[dict[str, Any]]]) -> str:
        return stat([v for r in seeds.values() if (v := at(r, "final")) is not None],
                    empty="-").replace(" (n=3)", "")

    def change(c: str, s: str, seeds: dict[int, list[dict[str, Any]]]) -> str:
        base = ref.get(s, {})
        d = [v - b for k, r in seeds.items() if k in base
             and (v := at(r, "final")) is not None and (b := at(base[k], "final")) is not None]
        return "-" if c == page.matrix[0] or not d else stat(d).replace(" (n=3)", "")

    def rejected(c: str, s: str, seeds: dict[int, list[dict[str, Any]]]) -> str:
        n = [sum(float(r.get("clients-rejected", 0)) for r in recs) for recs in seeds.values()]
        return f"{statistics.mean(n):.1f}" if n else "-"

    figures = [f"![{page.settings[c]}]({curves(runs, c, out / f'{group}-{c}-accuracy.png', page.settings[c], page.names, page.xlabel, plot=plot).name})"
               for c in cols]
    return ("### Final accuracy % (mean ± std across seeds; n=3 unless shown)\n\n"
            f"Source: `{page.source(group, '<setting>')}`.\n\n{grid(final)}\n\n"
            f"### Change against the same run without attackers (points, same seed)\n\n"
            f"{grid(change)}\n\n"
            "### Replies refused or missing per run (mean across seeds)\n\n"
            f"{grid(rejected)}\n\n" + "\n".join(figures) + "\n")


def section(page: Page, group: str, runs: Runs, out: Path, plot: bool = True) -> str:
    """The generated section of ``page`` from ``runs``, its curves written under ``out``
    (unless not ``plot``)."""
    names, parts = page.names, []
    for setting, title in page.settings.items():
        if setting not in runs:
            continue
        if setting in page.matrix:
            continue
        parts.append(f"### {title} (`{page.source(group, setting)}`)\n\n"
                     f"{table(runs, setting, page.points, names, finals=page.finals)}\n")
        if flagged := refusals(runs, setting, names):
            parts.append(flagged)
        if page.means:
            parts.append(means(runs, setting, page.means, page.means_from, names, page.paired)
                         + "\n")
            for k, label in page.means.items():
                if any(k in r for seeds in runs[setting].values() for recs in seeds.values()
                       for r in recs):
                    png = curves(runs, setting, out / f"{group}-{setting}-{k}.png",
                                 f"{title}: {label}", names, page.xlabel, key=k, ylabel=label,
                                 scale=1.0, plot=plot)
                    parts.append(f"![{title}: {label}]({png.name})\n")
        if setting in page.windows:
            parts.append(windows_table(runs, setting, page.windows[setting], str(page.paired),
                                       page.means, names))
        doms = sorted({k for seeds in runs[setting].values() for recs in seeds.values()
                       for k in recs[-1] if k.startswith("accuracy-domain-")})
        if doms:
            rows = ["| method | " + " | ".join(d.replace("accuracy-", "") for d in doms) + " |",
                    "|---|" + "---:|" * len(doms)]
            for strategy, seeds in runs[setting].items():
                cells = [stat([v for r in seeds.values() if (v := at(r, "final", d)) is not None])
                         for d in doms]
                rows.append(f"| {names.get(strategy, strategy)} | " + " | ".join(cells) + " |")
            parts.append("Per domain (final accuracy %, mean ± std across seeds; domain k is "
                         "client k's transform):\n\n" + "\n".join(rows) + "\n")
        png = curves(runs, setting, out / f"{group}-{setting}-accuracy.png", title, names,
                     page.xlabel, plot=plot)
        parts.append(f"![{title}]({png.name})\n")
    if page.matrix:
        parts.insert(0, matrix_tables(runs, page, group, out, plot))
    for base, groups in page.baseline:
        parts.append(paired(runs, page.points, base, groups, names))
    if page.pairs:  # named comparisons, possibly across settings
        parts.append(paired_table(runs, page.points, page.pairs, names))
    if page.paired:  # against the baseline of the same setting and seed
        parts.append(paired(runs, page.points, page.paired,
                            {s: (s,) for s in page.settings if s in runs}, names))
    if page.regime:  # one row per setting: where the gain holds, and the mechanism
        method, warmup_key = page.regime
        parts.append(regime_table(runs, method, str(page.paired), warmup_key, page.means,
                                  page.means_from, names, page.settings))
    if page.claims:
        parts.append(claims_table(runs, page.claims, names))
    return "\n".join(parts) or "(no runs yet)\n"


#: groups whose records are archived without a page of their own (docs/results/lss.md's
#: regime table is written from them by hand)
ARCHIVE_ONLY = ("lss-regime",)


def write(group: str, runs: Path | None, out: Path, plot: bool) -> str:
    """Archive ``group``'s finished runs and rewrite its page under ``out``; the new text."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if group in RUN_PAGES:
        return single_runs.write(RUN_PAGES[group], runs or ROOT / "runs", out, plot)
    if group in ARCHIVE_ONLY:
        got = collect(runs or ROOT / "runs" / group, data, group, {})
        return f"{group}: records in {data}/{group}-*.jsonl ({len(got)} settings read back)"
    page = PAGES[group]
    found = collect(runs or ROOT / "runs" / group, data, group, page.settings,
                    page.refusals_expected)
    body = section(page, group, found, out, plot)
    doc = out / f"{page.doc or group}.md"
    text = doc.read_text() if doc.exists() else f"# {group}\n"
    doc.write_text(recording.replace_section(text, page.section, "\n" + body))
    return body


def check(plot: bool) -> int:
    """Regenerate every page from the archived records into a copy of docs/results/ (no
    runs read) and compare: 0 when every page (and, with ``plot``, every figure) is
    byte-identical, else 1 with the files that differ."""
    import filecmp
    import shutil
    import tempfile

    src = ROOT / "docs" / "results"
    with tempfile.TemporaryDirectory() as tmp:
        out, empty = Path(tmp) / "results", Path(tmp) / "no-runs"
        shutil.copytree(src, out)
        empty.mkdir()
        for group in [*PAGES, *RUN_PAGES]:
            write(group, empty, out, plot)
        names = [f.name for f in src.iterdir() if f.is_file()
                 and (f.suffix == ".md" or (plot and f.suffix == ".png"))]
        new = sorted({f.name for f in out.iterdir() if f.is_file()} - {f.name for f in src.iterdir()})
        _, differ, _ = filecmp.cmpfiles(src, out, names, shallow=False)
    for name in differ:
        print(f"report --check: docs/results/{name} differs from what its records give")
    for name in new:
        print(f"report --check: docs/results/{name} is made but not kept")
    if not differ and not new:
        print(f"report --check: {len(names)} files regenerated byte-identical")
    return 1 if differ or new else 0


def main() -> int:
    """Collect, tabulate, plot, and write the generated sections."""
    groups = (*PAGES, *RUN_PAGES, *ARCHIVE_ONLY)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="*", metavar="GROUP", help=f"{', '.join(groups)} or all")
    ap.add_argument("--runs", help="default: runs/<group> (single runs: runs)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--no-plots", action="store_true", help="tables only (the figures are "
                    "the slow part)")
    ap.add_argument("--check", action="store_true", help="regenerate every page into a copy "
                    "and compare with docs/results/")
    args = ap.parse_args()
    if args.check:
        return check(not args.no_plots)
    todo = list(PAGES) + list(RUN_PAGES) if args.groups == ["all"] else args.groups
    if not todo or (bad := [g for g in todo if g not in groups]):
        ap.error(f"name a group: {', '.join(groups)} or all" if not todo
                 else f"unknown group {bad[0]!r}; one of {', '.join(groups)} or all")
    for group in todo:
        print(write(group, Path(args.runs) if args.runs else None, Path(args.out), not args.no_plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
