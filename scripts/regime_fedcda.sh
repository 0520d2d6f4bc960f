#!/usr/bin/env bash
# Issue 17 item 2: FedCDA beside FedAvg in three local-training regimes, Dirichlet 0.5 and
# 0.3, seeds ${SEEDS:-0,1,2} (fedsys run --seeds): runs/fedcda-regime/<setting>/seed-<k>/, with
# one table and figure across the seeds present in runs/fedcda-regime/<setting>/.
# resume=true: a seed that was interrupted continues from its checkpoints, a finished one is
# not run again (run this script again).
# Settings: dir<alpha>-<regime>, alpha 0.5 or 0.3;
#   m1e-4-e1 = the preset's schedule (momentum 1e-4, E = 1, warmup 15);
#   m0.9-e1 / m0.9-e2 = momentum 0.9 with E = 1 / E = 2, warmup 20 of 60 rounds.
# Usage: nice -n 19 scripts/regime_fedcda.sh [setting...]   (default: all six; 22-25 minutes
# per setting and seed on 2 idle cores, measured; E = 2 about twice)
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/fedcda-regime}
declare -A REGIME=(
  [m1e-4-e1]="--set momentum=0.0001 --set local-epochs=1"
  [m0.9-e1]="--set momentum=0.9 --set local-epochs=1 --set fedcda.warmup=20"
  [m0.9-e2]="--set momentum=0.9 --set local-epochs=2 --set fedcda.warmup=20"
)
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.5-m1e-4-e1 dir0.5-m0.9-e1 dir0.5-m0.9-e2
                                         dir0.3-m1e-4-e1 dir0.3-m0.9-e1 dir0.3-m0.9-e2)
status=0
for name in "${settings[@]}"; do
  alpha=${name%%-*}; alpha=${alpha#dir}; r=${name#*-}
  if [[ -z ${REGIME[$r]:-} || ! $alpha =~ ^0\.[0-9]+$ ]]; then
    echo "regime: unknown setting $name (dir0.5|dir0.3 - m1e-4-e1|m0.9-e1|m0.9-e2)" >&2; exit 2
  fi
  # partition: dirichlet, the split of the regime rows on docs/results/fedcda.md (the preset
  # moved to dirichlet-balanced with issue 45)
  # shellcheck disable=SC2086
  $FEDSYS run configs/fedcda-dir0.5.yaml --seeds "${SEEDS:-0,1,2}" --set resume=true \
    --set partition=dirichlet \
    --set dirichlet-alpha="$alpha" ${REGIME[$r]} --set output-dir="$OUT" --set name="$name" \
    || { echo "regime: $OUT/$name failed" >&2; status=1; }
done
exit $status
