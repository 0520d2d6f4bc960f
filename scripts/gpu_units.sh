#!/usr/bin/env bash
# A method's presets, every strategy of every seed as its own run, many at once on one GPU box
# (the reproductions of docs/results/<method>.md where 2 CPU cores would take hours): each unit
# is `fedsys run configs/<method>-<setting>.yaml --set seed=<k> --set strategy=<entry>
# --set device=cuda --set client-num-gpus=1`, and its records land where
# scripts/reproduce.py puts them, runs/<method>/<setting>/seed-<k>/<label>/, so that
# `python scripts/report.py <method>` reads them.  Units run in the order given
# (settings, then seeds, then the preset's strategies), JOBS at a time; a unit whose
# metrics.jsonl is there is skipped.  Checkpoints and models are emptied after a unit (the
# report needs the records; keep the box's results small).  A unit cut off (a time limit, a
# kill) keeps its folder under $OUT/.tmp: run the script again and it goes on from its last
# checkpoint (`fedsys resume`; `--set checkpoint-every=k` in EXTRA bounds the rounds lost).
# On an offline GPU box, first `source .gpu/setup.sh` (../shared/gpu/README.md); FEDSYS then defaults to
# `python3 -m fedsys_launch.commands.cli`.
# DEVICE (cuda), GPUS (1: a client's share of the GPU as Ray counts it; 1 starts one ClientApp
# actor per run, so that 10 runs at once hold 10 actors, not 100) and EXTRA (more --set flags) change
# the runs; a smoke test on the CPU: DEVICE=cpu GPUS=0 EXTRA="--set samples-per-client=100".
# STRATEGIES (labels, space-separated) keeps only those of each preset's strategies.
# Usage: SEEDS="0 1 2" JOBS=12 scripts/gpu_units.sh fedelmy e3 dir0.5 ...
set -uo pipefail
cd "$(dirname "$0")/.."
method=${1:?usage: gpu_units.sh METHOD SETTING...}; shift
FEDSYS=${FEDSYS:-python3 -m fedsys_launch.commands.cli}
OUT=${OUT_RUNS:-runs/$method}
DEVICE=${DEVICE:-cuda} GPUS=${GPUS:-1} EXTRA=${EXTRA:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} FEDSYS OUT method DEVICE GPUS EXTRA
units=$(STRATEGIES=${STRATEGIES:-} python3 - "$method" "${SEEDS:-0 1 2}" "$@" <<'PY'
import os
import sys
from pathlib import Path
from fedsys_launch import config_schema
from fedsys.config import parse_strategy
method, seeds, settings = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
keep = os.environ["STRATEGIES"].split()
for s in settings:
    cfg = config_schema.load(Path(f"configs/{method}-{s}.yaml"))
    for seed in seeds:
        for v in parse_strategy(cfg.strategy, cfg.schema):
            if keep and v.label not in keep:
                continue
            entry = v.name + ("[" + ";".join(f"{k}={val}" for k, val in v.overrides) + "]"
                              if v.overrides else "")
            print(s, seed, v.label, entry)
PY
) || exit 1
unit() {
  local setting=$1 seed=$2 label=$3 entry=$4
  local dest="$OUT/$setting/seed-$seed/$label" tmp="$OUT/.tmp/$setting-$seed-$label"
  [[ -f "$dest/metrics.jsonl" ]] && return 0
  local t0=$SECONDS how
  if [[ -f "$tmp/u/$label/checkpoint.pt" ]]; then  # cut off before: on from its checkpoint
    how="resumed from round $(tail -1 "$tmp/u/$label/metrics.jsonl" 2>/dev/null | python3 -c \
      'import json, sys; print(json.loads(sys.stdin.read()).get("round"))' 2>/dev/null)"
    $FEDSYS resume "$tmp/u" >> "$tmp.log" 2>&1
  else
    how=new
    rm -rf "$tmp"; mkdir -p "$tmp" "$(dirname "$dest")"
    $FEDSYS run "configs/$method-$setting.yaml" --set seed="$seed" --set strategy="$entry" \
      --set device="$DEVICE" --set client-num-gpus="$GPUS" $EXTRA --set output-dir="$tmp" --set name=u \
      > "$tmp.log" 2>&1
  fi
  if [[ $? == 0 && -f "$tmp/u/$label/model.pt" ]]; then
    # moved first, emptied after: a kill in between leaves a finished unit (its records
    # whole, its files big), never a finished run with an emptied checkpoint to resume
    rm -rf "$dest"; mv "$tmp/u/$label" "$dest"  # (a leftover without records replaced)
    for f in "$dest"/*.pt; do : > "$f"; done
    rm -f "$dest"/*.png
    echo "unit $setting seed $seed $label ($how): done in $((SECONDS - t0)) s"
  else
    echo "unit $setting seed $seed $label ($how): FAILED after $((SECONDS - t0)) s; log:"; tail -5 "$tmp.log"
  fi
}
export -f unit
echo "$units" | xargs -P "${JOBS:-8}" -L 1 bash -c 'unit "$@"' _
