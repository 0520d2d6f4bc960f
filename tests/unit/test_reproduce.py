"""scripts/reproduce.py, the one driver of every reproduction (issue 43 item 3): one seed of
one setting at a time, a seed whose records are archived is skipped, a missing seed is run and
its records archived by scripts/report.py; a second pass runs nothing.  And the experiments'
table itself: every page's heading names an experiment that exists, every branch starts from
an earlier run of the same experiment.

The driver test runs on a copy of the scripts with a stand-in ``fedsys`` that writes a finished
run's files, so the driver and the report tool are the real ones.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
# a stand-in for `fedsys run PRESET --set k=v ... --seeds K`: the files of a finished run
ARGS="$*"
# (and, after the arguments, how many records of the seed were archived when it started)
[[ $1 == run ]] || exit 3
preset=$2; shift 2
declare -A set
seed=
while [[ $# -gt 0 ]]; do
  case $1 in --set) set[${2%%=*}]=${2#*=}; shift ;; --seeds) seed=$2; shift ;; esac; shift
done
n=$(ls docs/results/data | grep -c -- "-s$seed-")
echo "$ARGS archived=$n" >> "$STUB_LOG"
exec "$PY" - "$preset" "${set[output-dir]}/${set[name]}/seed-$seed" "$seed" "${set[strategy]}" <<'PY'
import json, sys
from pathlib import Path
from fedsys_launch import config_schema
preset, run_dir, seed, strategy = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for label, _ in config_schema.load(preset, [f"strategy={strategy}"] if strategy else []).variants():
    d = run_dir / label
    d.mkdir(parents=True, exist_ok=True)
    recs = [{"round": r, "accuracy": 0.1 + 0.01 * r + 0.001 * seed, "clients-ok": 3,
             "clients-rejected": 0} for r in range(4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\\n" for x in recs))
    (d / "model.pt").write_bytes(b"")
PY
"""


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up while defined
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scripts() -> Iterator[tuple[ModuleType, ModuleType]]:
    try:
        yield _load("reproduce"), _load("report")
    finally:
        for name in ("reproduce", "report", "single_runs", "asdata"):
            sys.modules.pop(name, None)


def test_the_driver_runs_only_the_missing_seed_and_archives_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for f in ("reproduce.py", "report.py", "single_runs.py", "asdata.py"):
        shutil.copy2(ROOT / "scripts" / f, repo / "scripts" / f)
    shutil.copytree(ROOT / "configs" / "experiments", repo / "configs" / "experiments")
    shutil.copytree(ROOT / "docs" / "results" / "pages", repo / "docs" / "results" / "pages")
    shutil.copy2(ROOT / "configs" / "fedelmy-domain.yaml", repo / "configs")
    data = repo / "docs" / "results" / "data"
    data.mkdir(parents=True)
    shutil.copy2(ROOT / "docs" / "results" / "fedelmy.md", repo / "docs" / "results")
    for seed in (0, 2):  # archived; seed 1 is not
        for f in (ROOT / "docs" / "results" / "data").glob(f"fedelmy-domain-s{seed}-*.jsonl"):
            shutil.copy2(f, data)
    stub = tmp_path / "fedsys"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PY": sys.executable, "FEDSYS": str(stub), "STUB_LOG": str(log),
           "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}

    def drive() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(repo / "scripts" / "reproduce.py"), "fedelmy/domain"],
                              env=env, capture_output=True, text=True, timeout=300, check=False)

    first = drive()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "fedelmy/domain seed 0: archived, skipped" in first.stdout
    assert "fedelmy/domain seed 2: archived, skipped" in first.stdout
    calls = log.read_text().splitlines()
    labels = [lab for lab, _ in registry_variants(repo / "configs" / "fedelmy-domain.yaml")]
    assert len(calls) == len(labels) + 1 == 5, calls  # one command a strategy of the preset,
    for k, call in enumerate(calls[:4]):
        assert re.search(r" --set strategy=\S+ --set resume=true --set output-dir=runs/fedelmy "
                         rf"--set name=domain --seeds 1 archived={k}$", call), call
    # then, all finished here, the whole command once (each resumes at its end) so that the
    # seed's results.md lists every strategy
    assert "strategy=" not in calls[4]
    assert re.search(r" --set resume=true --set output-dir=runs/fedelmy --set name=domain --seeds 1 "
                     r"archived=4$", calls[4]), calls[4]
    assert len(list(data.glob("fedelmy-domain-s1-*.jsonl"))) == 4  # the preset's 4 runs
    assert (repo / "runs" / "fedelmy" / "domain" / "seed-1.log").read_text().count("=== ") == 5
    again = drive()
    assert again.returncode == 0, again.stderr[-2000:]
    assert "fedelmy/domain seed 1: archived, skipped" in again.stdout
    assert len(log.read_text().splitlines()) == 5  # nothing ran the second time

    # a seed on a new machine (no runs/) with two strategies archived runs the other two
    shutil.rmtree(repo / "runs")
    kept = {labels[0], labels[2]}
    for f in data.glob("fedelmy-domain-s1-*.jsonl"):
        if f.stem.removeprefix("fedelmy-domain-s1-") not in kept:
            f.unlink()
    log.write_text("")
    third = drive()
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    calls = log.read_text().splitlines()
    assert [c.split(" --set strategy=")[1].split(" --set ")[0] for c in calls] == \
        [spec for lab, spec in zip(labels, registry_specs(repo / "configs" / "fedelmy-domain.yaml"),
                                   strict=True) if lab not in kept], calls
    assert [c.rsplit("archived=", 1)[1] for c in calls] == ["2", "3"]  # each archived at once
    # the two finished elsewhere are not run again to gather the seed's table: said instead
    away = [lab for lab in labels if lab in kept]
    assert f"fedelmy/domain seed 1: {', '.join(away)} finished on another machine" in third.stdout
    assert len(list(data.glob("fedelmy-domain-s1-*.jsonl"))) == 4


def registry_variants(preset: Path) -> list[tuple[str, object]]:
    sys.path.insert(0, str(ROOT))
    from fedsys_launch import config_schema

    return list(config_schema.load(preset).variants())


def registry_specs(preset: Path) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from fedsys.config import parse_strategy
    from fedsys_launch import config_schema

    cfg = config_schema.load(preset)
    return [v.spec for v in parse_strategy(cfg.strategy, cfg.schema)]


def test_a_strategy_run_alone_is_the_same_run_as_in_its_whole_command(
        scripts: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's one-strategy commands (``--set strategy=ENTRY`` after the run's own
    overrides) configure each strategy exactly as the whole command does, for every seeded
    experiment without branches; an experiment with branches keeps its commands whole."""
    reproduce, _ = scripts
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(reproduce, "DATA", Path("no-such-archive"))  # nothing archived
    sys.path.insert(0, str(ROOT))
    from fedsys_launch import config_schema

    split = 0
    for exp in reproduce.experiments():
        if exp.seeds is None:
            continue
        cmds = reproduce.pending(exp, exp.seeds[0])
        if reproduce.branches(exp):
            assert cmds == [exp.command(r, exp.seeds[0]) for r in exp.runs], exp.key
            continue
        whole = [v for r in exp.runs for v in config_schema.load(
            Path(r.preset), [a for a in exp.command(r, exp.seeds[0])[3::2] if "=" in a]).variants()]
        assert len(cmds) == len(whole) == reproduce.strategies_of(exp), exp.key
        for cmd, (label, vcfg) in zip(cmds, whole, strict=True):
            [(one_label, one)] = config_schema.load(Path(cmd[1]), [a for a in cmd[3::2] if "=" in a]).variants()
            assert (one_label, one) == (label, vcfg), exp.key
            split += 1
    assert split >= 50


def test_every_page_heading_names_an_experiment_of_the_driver(
        scripts: tuple[ModuleType, ModuleType]) -> None:
    reproduce, report = scripts
    keys = {e.key for e in reproduce.experiments()}
    named = 0
    for group, page in report.PAGES.items():
        for setting in page.settings:
            source = page.source(group, setting)
            if m := re.fullmatch(r"python scripts/reproduce\.py (\S+)", source):
                assert m.group(1) in keys, (group, setting, source)
                named += 1
    assert named >= 20  # FedCDA's regimes and seeds, FedCross, IMA, LSS's premise, FedELMY


def test_every_branch_starts_from_an_earlier_run_of_its_experiment(
        scripts: tuple[ModuleType, ModuleType]) -> None:
    reproduce, _ = scripts
    branched = 0
    for exp in reproduce.experiments():
        made: list[str] = []
        for run in exp.runs:
            cmd = exp.command(run, 0 if exp.seeds is not None else None)
            sets = dict(s.split("=", 1) for s in cmd[3::2] if "=" in s)
            if src := sets.get("branch-from"):
                branched += 1
                assert any(src.startswith(m + "/") for m in made), (exp.key, src, made)
            made.append(f"runs/{exp.group}/{sets['name']}/seed-{{seed}}" if exp.seeds is not None
                        else f"runs/{sets['name']}")
    assert branched == 2 * 5  # IMA's two branches: 2 across seeds, 3 single


def test_a_wrong_target_is_refused_naming_the_known_ones(
        scripts: tuple[ModuleType, ModuleType]) -> None:
    reproduce, _ = scripts
    with pytest.raises(SystemExit, match=r"unknown target 'fedcda-seed'.*headlines"):
        reproduce.main(["fedcda-seed", "--dry-run"])


def test_list_says_how_far_each_seed_is(scripts: tuple[ModuleType, ModuleType], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--list``'s state of a seed: archived (its records in docs/results/data), to run
    (nothing recorded), partial (rounds recorded, no driver on it: the next one resumes it),
    running (a driver holds its lock), with each strategy's rounds."""
    reproduce, _ = scripts
    (tmp_path / "configs").mkdir()
    shutil.copy2(ROOT / "configs" / "fedelmy-domain.yaml", tmp_path / "configs")
    data = tmp_path / "docs" / "results" / "data"
    data.mkdir(parents=True)
    for f in (ROOT / "docs" / "results" / "data").glob("fedelmy-domain-s0-*.jsonl"):
        shutil.copy2(f, data)
    monkeypatch.chdir(tmp_path)
    exp = next(e for e in reproduce.experiments() if e.key == "fedelmy/domain")
    sys.path.insert(0, str(ROOT))
    from fedsys_launch import config_schema

    variants = config_schema.load(Path(exp.runs[0].preset), list(exp.runs[0].sets)).variants()
    assert len(variants) == 4
    label, cfg = variants[1]
    rounds = cfg.num_server_rounds
    seed1 = tmp_path / "runs" / "fedelmy" / "domain" / "seed-1"
    (seed1 / label).mkdir(parents=True)
    (seed1 / label / "metrics.jsonl").write_text(  # the last line still being written
        "".join(f'{{"round": {r}, "accuracy": 0.5}}\n' for r in range(4)) + '{"round": 4, "acc')
    expect = ", ".join(f"{lab} {3 if lab == label else 0}/{v.num_server_rounds}"
                       for lab, v in variants)
    assert f"{label} 3/{rounds}" in expect
    assert reproduce.state(exp, 0) == "archived"
    assert reproduce.state(exp, 2) == "to run"
    assert reproduce.state(exp, 1) == f"partial ({expect})"
    with reproduce.locked(seed1.with_suffix(".lock"), wait=False) as held:
        assert held
        assert reproduce.state(exp, 1) == f"running ({expect})"
        assert reproduce.state(exp, 2) == "to run"
    assert reproduce.state(exp, 1) == f"partial ({expect})"
    # a strategy archived on another machine (no runs/ here): partial, its record's rounds
    first = variants[0][0]
    shutil.copy2(ROOT / "docs" / "results" / "data" / f"fedelmy-domain-s2-{first}.jsonl", data)
    done = reproduce.last_round(data / f"fedelmy-domain-s2-{first}.jsonl")
    assert done > 0
    assert reproduce.state(exp, 2) == "partial ({})".format(", ".join(
        f"{lab} {done if lab == first else 0}/{v.num_server_rounds}"
        for lab, v in variants))


def test_list_prints_every_experiment_with_its_state(
        scripts: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    reproduce, _ = scripts
    monkeypatch.chdir(ROOT)  # main() moves there; restored afterwards
    assert reproduce.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = reproduce.experiments()
    assert [ln.split()[0] for ln in lines] == [e.key for e in table]
    state = re.compile(r"(archived|to run|(running|partial) \(.*\))")
    for ln in lines:
        now = ln.split(None, 4)[4]  # after the key, batch and "seeds 0,1,2" / "one run"
        assert all(state.fullmatch(p.split(": ", 1)[-1]) for p in now.split("; ")), ln
    assert sum(ln.endswith(" archived") for ln in lines) >= 50  # every page's records


def test_the_matrix_is_data_and_a_wrong_entry_is_named(scripts: tuple[ModuleType, ModuleType],
                                                       tmp_path: Path) -> None:
    """Issue 66 item 5: the experiment matrix is configs/experiments/matrix.yaml, read into
    typed experiments; a wrong key or value names the file, the entry and what it takes."""
    reproduce, _ = scripts
    exps = reproduce.experiments()
    assert exps[0].key == "fedcda-regime/dir0.5-m1e-4-e1" and exps[0].seeds == (0, 1, 2)
    ima = next(e for e in exps if e.key == "ima-runs/shards2")
    assert ima.seeds is None and len(ima.runs) == 3 and isinstance(ima.after[0], tuple)
    bad = tmp_path / "matrix.yaml"
    bad.write_text("lss/x:\n  batch: lss\n  runs: [{preset: configs/lss-fmnist.yaml}]\n  seed: [1]\n")
    with pytest.raises(reproduce.asdata.DataError,
                       match=r"matrix.yaml: lss/x: Experiment has no field 'seed' \(did you mean 'seeds'\?\)"):
        reproduce.experiments(bad)
    bad.write_text("lss/x:\n  batch: lss\n  runs: [{preset: configs/lss-fmnist.yaml}]\n  seeds: 3\n")
    with pytest.raises(reproduce.asdata.DataError, match=r"lss/x.seeds: expected a list, got 3"):
        reproduce.experiments(bad)
    bad.write_text("just-a-group:\n  batch: lss\n  runs: []\n")
    with pytest.raises(reproduce.asdata.DataError, match="is not GROUP/SETTING"):
        reproduce.experiments(bad)



def test_a_wrong_matrix_is_one_line_from_the_driver(scripts: tuple[ModuleType, ModuleType],
                                                   tmp_path: Path, monkeypatch, capsys) -> None:
    reproduce, _ = scripts
    bad = tmp_path / "matrix.yaml"
    bad.write_text("lss/x:\n  batsh: lss\n  runs: []\n")
    read = reproduce.experiments
    monkeypatch.setattr(reproduce, "experiments", lambda: read(bad))
    assert reproduce.main(["--list"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("reproduce: matrix.yaml: lss/x: Experiment has no field 'batsh' (did "
                           "you mean 'batch'?); its fields: after, archive, batch, group, pretrain, "
                           "runs, seeds, setting"), err
