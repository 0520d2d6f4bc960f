"""scripts/reproduce_seeds.sh, the one seeds driver (issue 43 item 3): one seed of one setting
at a time, a seed whose records are archived is skipped, a missing seed is run once through
its method's script and its records archived; a second pass runs nothing.

Run on a copy of the scripts with a stand-in ``fedsys`` that writes a finished run's files,
so the driver, the per-method script and scripts/seeds_report.py are the real ones.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
# a stand-in for `fedsys run PRESET --set seed=K --set output-dir=D --set name=N`
echo "$*" >> "$STUB_LOG"
[[ $1 == run ]] || exit 3
preset=$2; shift 2
declare -A set
while [[ $# -gt 0 ]]; do [[ $1 == --set ]] && { set[${2%%=*}]=${2#*=}; shift; }; shift; done
exec "$PY" - "$preset" "${set[output-dir]}/${set[name]}" "${set[seed]}" <<'PY'
import json, sys
from pathlib import Path
from launch import registry
preset, run_dir, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
for label, _ in registry.load(preset).variants():
    d = run_dir / label
    d.mkdir(parents=True, exist_ok=True)
    recs = [{"round": r, "accuracy": 0.1 + 0.01 * r + 0.001 * seed, "clients-ok": 3,
             "clients-rejected": 0} for r in range(4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\\n" for x in recs))
    (d / "model.pt").write_bytes(b"")
(run_dir / "results.md").write_text("done\\n")
PY
"""


def test_the_driver_runs_only_the_missing_seed_and_archives_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for f in ("reproduce_seeds.sh", "reproduce_fedelmy.sh", "seeds_report.py"):
        shutil.copy2(ROOT / "scripts" / f, repo / "scripts" / f)
    (repo / "configs").mkdir()
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
        return subprocess.run(["bash", str(repo / "scripts" / "reproduce_seeds.sh"), "fedelmy"],
                              env=env, capture_output=True, text=True, timeout=300, check=False)

    first = drive()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "fedelmy/domain seed 0: archived, skipped" in first.stdout
    assert "fedelmy/domain seed 2: archived, skipped" in first.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and "--set seed=1 " in calls[0] + " ", calls
    assert len(list(data.glob("fedelmy-domain-s1-*.jsonl"))) == 4  # the preset's 4 runs
    again = drive()
    assert again.returncode == 0, again.stderr[-2000:]
    assert "fedelmy/domain seed 1: archived, skipped" in again.stdout
    assert len(log.read_text().splitlines()) == 1  # nothing ran the second time
