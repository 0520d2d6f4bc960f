"""scripts/report.py: the statistics a results page rests on, and the flag on
rounds whose replies were refused (a number that rests on fewer clients than asked)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def report() -> Iterator[ModuleType]:
    path = Path(__file__).resolve().parents[2] / "scripts" / "report.py"
    spec = importlib.util.spec_from_file_location("report", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["report"] = mod  # its dataclasses look their module up while defined
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("report", None)


def _recs(accs: list[float], rejected: dict[int, int] | None = None) -> list[dict]:
    out: list[dict] = [{"round": 0, "accuracy": 0.1}]
    for i, a in enumerate(accs, start=1):
        bad = (rejected or {}).get(i, 0)
        out.append({"round": i, "accuracy": a, "clients-ok": 4 - bad, "clients-rejected": bad})
    return out


def test_final_and_last10_skip_round_zero(report: ModuleType) -> None:
    recs = _recs([0.1 * k for k in range(1, 13)])
    assert report.at(recs, "final") == pytest.approx(120.0)
    assert report.at(recs, "last10") == pytest.approx(100 * sum(0.1 * k for k in range(3, 13)) / 10)
    assert report.at(recs, 2) == pytest.approx(20.0)
    assert report.at(recs, 99) is None


def test_refused_rounds_are_named_per_strategy_seed_and_round(report: ModuleType) -> None:
    runs = {"dir0.3": {"fedavg": {0: _recs([0.5] * 5, {3: 4}), 1: _recs([0.5] * 5)},
                       "fedcda": {2: _recs([0.5] * 5, {1: 1, 5: 2})}}}
    text = report.refusals(runs, "dir0.3")
    assert "fedavg s0: round 3 (4 of 4)" in text
    assert "fedcda s2: round 1 (1 of 4), round 5 (2 of 4)" in text
    assert "s1" not in text


def test_no_refusal_no_flag(report: ModuleType) -> None:
    assert report.refusals({"dir0.5": {"fedavg": {0: _recs([0.5] * 3)}}}, "dir0.5") == ""
    assert report.refusals({}, "dir0.5") == ""


def test_claim_statistics(report: ModuleType) -> None:
    recs = _recs([0.5, 0.7] * 10)                                   # swings 50 <-> 70
    assert report.measure(recs, "last10-std") == pytest.approx(10.5409, abs=1e-3)
    assert report.measure(recs, "rounds:1-4") == pytest.approx(60.0)
    assert report.measure(recs, "rounds:1-30") is None                # the run stopped at 20
    assert report.measure(_recs([0.5] * 9), "last10-std") is None
    assert report.measure(recs, "rounds-to:70") == 2.0                # first at 70 %
    assert report.measure(recs, "rounds-to:50") == 1.0
    assert report.measure(recs, "rounds-to:71") == 21.0               # never: last round + 1
    assert report.measure(recs, "round:2") == pytest.approx(70.0)     # after round 2
    assert report.measure(recs, "round:21") is None
    assert report.measure(_recs([0.3, 0.4, 0.6]), "gain:1-3") == pytest.approx(30.0)
    assert report.measure(recs, "gain:1-30") is None
    with pytest.raises(ValueError, match="unknown statistic"):
        report.measure(recs, "median")


def test_claims_are_judged_in_their_claimed_direction(report: ModuleType) -> None:
    swing, steady = [0.5, 0.7] * 10, [0.6] * 20
    runs = {"s": {"fedavg": {k: _recs([a + 0.01 * k for a in swing]) for k in range(3)},
                  "fedcda": {k: _recs([a + 0.01 * k + 0.001 * k * k for a in steady])
                             for k in range(3)}}}
    claims = [("steadier", "s", "fedcda", "s", "fedavg", "last10-std", "<"),
              ("swings more", "s", "fedcda", "s", "fedavg", "last10-std", ">"),
              ("above", "s", "fedcda", "s", "fedavg", "last10", ">"),
              ("above, not run", "s", "fedcross", "s", "fedavg", "last10", ">")]
    rows = {r.split(" | ")[0].lstrip("| "): r for r in
            report.claims_table(runs, tuple(claims), {}).splitlines() if r.startswith("| ")}
    assert rows["steadier"].endswith("| holds |")
    assert rows["swings more"].endswith("| does not hold here |")
    assert rows["above"].endswith("| within noise, mean for |")        # 0.00, 0.10, 0.40 points
    assert rows["above, not run"].endswith("| (not run) |")


def test_windows_show_a_gap_closing_as_the_spread_settles(report: ModuleType) -> None:
    def run(accs: list[float], spread: list[float] | None = None) -> list[dict]:
        recs = _recs(accs)
        for r, v in zip(recs[1:], spread or [], strict=False):
            r["fedcross-slot-spread"] = v
        return recs

    runs = {"horizon": {
        "fedavg": {k: run([0.8 + 0.01 * k] * 20) for k in range(2)},
        "fedcross": {k: run([0.7 + 0.01 * k] * 10 + [0.8 + 0.01 * k] * 10, [1.0] * 10 + [0.2] * 10)
                     for k in range(2)},
        "short": {k: run([0.8] * 15) for k in range(2)}}}        # never reached round 20
    text = report.windows_table(runs, "horizon", ((1, 10), (11, 20)), "fedavg",
                                {"fedcross-slot-spread": "slot spread"}, {})
    rows = [r for r in text.splitlines() if r.startswith("| 1")]
    assert rows[0].startswith("| 1-10 | -10.00 ± 0.00 (n=2) | -0.50 ± 0.71 (n=2) | 1 ± 0 (n=2) |")
    assert rows[1].startswith("| 11-20 | 0.00 ± 0.00 (n=2) | - | 0.2 ± 0 (n=2) |")


def test_a_run_with_refused_replies_is_set_aside_not_archived(report: ModuleType, tmp_path,
                                                             capsys) -> None:
    from fedsys import metrics

    runs, data = tmp_path / "runs", tmp_path / "data"
    data.mkdir()
    for strategy, recs in (("fedavg", _recs([0.5] * 4)), ("fedcda", _recs([0.5] * 4, {3: 1}))):
        d = runs / "dir0.3" / "seed-0" / strategy
        d.mkdir(parents=True)
        metrics.write_jsonl(d / "metrics.jsonl", recs)
        (d / "model.pt").write_bytes(b"")
    settings = {"dir0.3": "Dirichlet 0.3"}
    got = report.collect(runs, data, "g", settings)
    assert list(got["dir0.3"]) == ["fedavg"]
    assert sorted(p.name for p in data.iterdir()) == ["g-dir0.3-s0-fedavg.jsonl"]
    assert (runs / "dir0.3" / "seed-0" / "fedcda.refused-1" / "metrics.jsonl").exists()
    assert not (runs / "dir0.3" / "seed-0" / "fedcda").exists()     # the seed runs it again
    assert "refused replies in rounds [3]: not archived" in capsys.readouterr().err
    report.collect(runs, data, "g", settings)                      # set aside once only
    assert not list((runs / "dir0.3" / "seed-0").glob("*.refused-1.refused-*"))


def test_the_generated_section_has_every_part(report: ModuleType, tmp_path, monkeypatch) -> None:
    from fedsys import metrics

    runs, out = tmp_path / "runs", tmp_path / "out"
    for strategy in ("fedavg", "fedcda"):
        d = runs / "dir0.5-m0.9-e1" / "seed-0" / strategy
        d.mkdir(parents=True)
        recs = _recs([0.5 + 0.01 * i for i in range(40)])
        for r in recs[1:]:
            r["global-step"] = 1.0 if strategy == "fedavg" else 0.1
            if strategy == "fedcda":
                r["fedcda-fresh-fraction"] = 0.2
        metrics.write_jsonl(d / "metrics.jsonl", recs)
        (d / "model.pt").write_bytes(b"")
    (out / "data").mkdir(parents=True)
    (out / "fedcda.md").write_text("# FedCDA\n")
    monkeypatch.setattr("sys.argv", ["report.py", "fedcda-regime", "--runs", str(runs),
                                     "--out", str(out)])
    assert report.main() == 0
    text = (out / "fedcda.md").read_text()
    for part in ("### Dirichlet 0.5, momentum 0.9, E = 1", "| FedCDA | ",
                 "(fedcda-regime-dir0.5-m0.9-e1-accuracy.png)",
                 "(fedcda-regime-dir0.5-m0.9-e1-fedcda-fresh-fraction.png)",
                 "(fedcda-regime-dir0.5-m0.9-e1-global-step.png)",
                 "### Paired differences against FedAvg",
                 "### Where the gain holds, and why", "| dir0.5-m0.9-e1 | ",
                 "### The paper's claims, judged on the seeds"):
        assert part in text, part
    assert (out / "fedcda-regime-dir0.5-m0.9-e1-global-step.png").stat().st_size > 0


def test_the_regime_row_reads_the_warmup_from_the_records(report: ModuleType) -> None:
    names = {"fedavg": "FedAvg", "fedcda": "FedCDA"}
    settings = {"dir0.3-x": "", "dir0.5-x": ""}
    def run(accs: list[float], warmup: int, step: float, fresh: float | None = None) -> list[dict]:
        recs = _recs(accs)
        for r in recs[1:]:
            r["global-step"] = step
            if fresh is not None:                             # FedCDA's keys; FedAvg logs neither
                r["fedcda-warmup"] = 1.0 if r["round"] <= warmup else 0.0
                r["fedcda-fresh-fraction"] = fresh
        return recs

    # the same 3 warmup rounds (60 %), then FedAvg swings 78-82 %, FedCDA 69.5-70.5 % / 71.5-72.5 %
    runs = {"dir0.5-x": {
        "fedavg": {k: run([0.5, 0.55, 0.6] + [0.78, 0.82] * 6, 0, 1.0) for k in range(2)},
        "fedcda": {k: run([0.5, 0.55, 0.6] + [0.695 + 0.02 * k, 0.705 + 0.02 * k] * 6, 3,
                          0.1 * (k + 1), 0.2) for k in range(2)}},
        "dir0.3-x": {"fedavg": {0: run([0.5] * 15, 0, 1.0)}}}   # FedCDA not run: no row
    text = report.regime_table(runs, "fedcda", "fedavg", "fedcda-warmup",
                               {"fedcda-fresh-fraction": "fresh", "global-step": "step"}, 4,
                               names, settings)
    rows = [r for r in text.splitlines() if r.startswith("| dir")]
    assert rows == ["| dir0.5-x | -9.00 ± 1.41 (n=2): -10.00, -8.00 | does not hold here | 60.00 ± 0.00 (n=2) "
                    "(round 3) | 20.00 ± 0.00 (n=2) | 11.00 ± 1.41 (n=2) | 0.2 ± 0 (n=2) | "
                    "0.15 ± 0.071 (n=2) (× 0.15 ± 0.071 (n=2)) | 4 ± 0 (n=2) |"], text
    assert "fresh, FedCDA |" in text and "step, FedCDA (× FedAvg's) |" in text


def test_every_page_is_a_typed_description_and_the_module_keeps_no_state(report: ModuleType) -> None:
    """Issue 43 item 3: each generated section is a frozen :class:`Page`; the tables read
    what they need from it, not from module globals a run fills in."""
    import dataclasses

    assert report.PAGES and all(isinstance(p, report.Page) for p in report.PAGES.values())
    page = report.PAGES["fedcda-seeds"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        page.doc = "other"  # type: ignore[misc]
    assert page.source("fedcda-seeds", "dir0.1") == "python scripts/reproduce.py fedcda-seeds/dir0.1"
    assert report.PAGES["lss"].source("lss", "fmnist") == "configs/lss-fmnist.yaml"
    assert not [n for n in ("SETTINGS", "NAMES", "METHOD", "METHODS") if hasattr(report, n)]
    runs = report.RUN_PAGES
    assert runs and all(isinstance(p, report.single_runs.RunsPage) for p in runs.values())


def test_every_results_page_regenerates_byte_identical_from_its_records(report: ModuleType,
                                                                        capsys) -> None:
    """Issue 43 item 3: what docs/results/*.md show in their generated parts is what the
    archived records in docs/results/data give (tables only; ``report.py --check`` without
    ``--no-plots`` compares the figures too)."""
    assert report.check(plot=False) == 0, capsys.readouterr().out


def test_a_single_run_table_is_written_between_its_markers_and_says_what_is_missing(
        report: ModuleType, tmp_path: Path) -> None:
    from fedsys import metrics

    sr = report.single_runs
    runs, out = tmp_path / "runs", tmp_path / "out"
    recs = _recs([0.5, 0.62, 0.71, 0.69])
    for strategy, r in (("fedavg", recs), ("fedprox", recs)):
        (runs / "x" / strategy).mkdir(parents=True)
        metrics.write_jsonl(runs / "x" / strategy / "metrics.jsonl", r)
    (out / "data").mkdir(parents=True)
    (out / "p.md").write_text("# p\n\nintro\n<!-- report: t -->\nold\n<!-- /report -->\nafter\n")
    page = sr.RunsPage("p", (sr.Table("t", "reach", rows={
        "FedAvg": (("x", "fedavg"),), "FedProx": (("x", "fedprox"),),
        "FedCross": (("x", "fedcross"),)}, targets=(60, 70, 72)),))
    sr.write(page, runs, out, plots=False)
    assert (out / "p.md").read_text() == (
        "# p\n\nintro\n<!-- report: t -->\n| method | 60 % | 70 % | 72 % |\n|---|---:|---:|---:|\n"
        "| FedAvg | 2 | 3 | - |\n| FedProx | 2 | 3 | - |\n\n(not run: FedCross)\n"
        "<!-- /report -->\nafter\n")
    assert len(metrics.read_jsonl(out / "data" / "x.jsonl")) == 2 * len(recs)  # archived
    (out / "p.md").write_text("# p\n")
    with pytest.raises(SystemExit, match="no line '<!-- report: t -->'"):
        sr.write(page, runs, out, plots=False)


def test_the_robustness_page_pairs_each_attack_with_the_same_run_without(report: ModuleType,
                                                                          tmp_path) -> None:
    """Issue 42 item 4: a run whose attackers' replies were refused is the experiment (kept,
    not redone); the matrix shows each defence's final accuracy per attack, its change
    against the same seed without attackers, and the refusals; DP rows show epsilon."""
    from fedsys import metrics

    runs, out = tmp_path / "runs", tmp_path / "out"
    finals = {("none", "fedavg"): 0.80, ("none", "median"): 0.78,
              ("scaled-1", "fedavg"): 0.79, ("scaled-1", "median"): 0.77}
    for seed in (0, 1, 2):
        for (setting, strategy), acc in finals.items():
            d = runs / setting / f"seed-{seed}" / strategy
            d.mkdir(parents=True)
            rej = {2: 1} if setting == "scaled-1" else {}
            metrics.write_jsonl(d / "metrics.jsonl", _recs([0.5, acc + 0.01 * seed], rej))
            (d / "model.pt").write_bytes(b"")
        d = runs / "dp" / f"seed-{seed}" / "dp-z0.01"
        d.mkdir(parents=True)
        recs = _recs([0.5, 0.6])
        for r in recs[1:]:
            r["dp-epsilon"], r["dp-clipped"] = 1000.0 * r["round"], 0.0
        metrics.write_jsonl(d / "metrics.jsonl", recs)
        (d / "model.pt").write_bytes(b"")
    (out / "data").mkdir(parents=True)
    (out / "robustness.md").write_text("# Robustness\n\n## Measured (generated)\n")
    text = report.write("robustness", runs, out, plot=False)
    assert len(list((out / "data").glob("robustness-scaled-1-s*-fedavg.jsonl"))) == 3
    assert "| method | no attackers | x100, 1 of 10 |" in text
    assert "| FedAvg (default bounds) | 81.00 ± 1.00 | 80.00 ± 1.00 |" in text
    assert "| median | - | -1.00 ± 0.00 |" in text                      # change, same seed
    assert "| FedAvg (default bounds) | 0.0 | 1.0 |" in text            # refused per run
    assert "| FedAvg + DP, z = 0.01 | 60.00 ± 0.00 (n=3) | 2000.00 ± 0.00 (n=3) | 0.00 ± 0.00 (n=3) |" in text
    assert "| none | median − FedAvg without bounds | (not run) |" in text  # its cost, paired


def test_the_pages_are_data_and_a_wrong_entry_is_named(report: ModuleType, tmp_path: Path) -> None:
    """Issue 66 item 5: every results page is described by docs/results/pages/<page>.yaml
    (its groups across seeds and of single runs), read into the typed descriptions; a wrong
    key or a value of the wrong kind names the file, the group and what it takes."""
    seeds, singles = report.load_pages()
    assert set(seeds) == {"fedcda-regime", "fedcda-seeds", "fedcross-seeds", "fedelmy",
                          "fedelmy-cpu", "ima-seeds", "lss", "robustness"}
    assert set(singles) == {"fedcda-runs", "fedcross-runs", "ima-runs"}
    assert seeds["fedelmy-cpu"].doc == "fedelmy" and singles["ima-runs"].doc == "ima"
    claim = seeds["fedcda-seeds"].claims[0]
    assert claim == ("FedCDA above FedAvg (Table 1)", "dir0.1", "fedcda", "dir0.1", "fedavg",
                     "last10", ">") and claim.baseline == "fedavg"
    (tmp_path / "p.yaml").write_text("g:\n  points: [final]\n  settings: {a: A}\n  names: {}\n"
                                     "  pairs: [[a, b, c]]\n")
    with pytest.raises(report.asdata.DataError, match=r"p.yaml: g.pairs\[0\]: expected 4 items"):
        report.load_pages(tmp_path)
    (tmp_path / "p.yaml").write_text("g:\n  points: [final]\n  settings: {a: A}\n  names: {}\n"
                                     "  claims: [{claim: c, setting: a}]\n")
    with pytest.raises(report.asdata.DataError, match="Claim takes exactly the fields claim, "
                       "setting, method, baseline-setting, baseline, statistic, direction"):
        report.load_pages(tmp_path)
    (tmp_path / "p.yaml").write_text("g:\n  point: [final]\n")
    with pytest.raises(report.asdata.DataError, match="Page has no field 'point' \\(did you mean 'points'"):
        report.load_pages(tmp_path)
