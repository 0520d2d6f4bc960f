#!/usr/bin/env bash
# Issue 17 item 2: FedCDA beside FedAvg in three local-training regimes, Dirichlet 0.5 and
# 0.3, seeds 0 1 2 (fedsys run --seeds): runs/fedcda-regime/<setting>/seed-<k>/, with one
# table and figure across seeds in runs/fedcda-regime/<setting>/.  resume=true: a setting
# or seed that was interrupted continues from its checkpoints (run this script again).
# Regimes: m1e-4-e1 = the preset's schedule (momentum 1e-4, E = 1, warmup 15);
#          m0.9-e1 / m0.9-e2 = momentum 0.9 with E = 1 / E = 2, warmup 20 of 60 rounds.
# Usage: nice -n 19 scripts/regime_fedcda.sh   (about 6 hours on 2 idle cores)
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/fedcda-regime}
declare -A REGIME=(
  [m1e-4-e1]="--set momentum=0.0001 --set local-epochs=1"
  [m0.9-e1]="--set momentum=0.9 --set local-epochs=1 --set fedcda.warmup=20"
  [m0.9-e2]="--set momentum=0.9 --set local-epochs=2 --set fedcda.warmup=20"
)
for alpha in 0.5 0.3; do
  for r in m1e-4-e1 m0.9-e1 m0.9-e2; do
    name="dir$alpha-$r"
    if [[ -f "$OUT/$name/results.md" ]]; then continue; fi
    # shellcheck disable=SC2086
    $FEDSYS run configs/fedcda-dir0.5.yaml --seeds "${SEEDS:-0,1,2}" --set resume=true \
      --set dirichlet-alpha=$alpha ${REGIME[$r]} --set output-dir="$OUT" --set name="$name" \
      || echo "regime: $OUT/$name failed" >&2
  done
done
