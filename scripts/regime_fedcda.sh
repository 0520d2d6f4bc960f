#!/usr/bin/env bash
# Issue 17 item 2: FedCDA beside FedAvg in three local-training regimes, Dirichlet 0.5 and
# 0.3, seeds 0 1 2.  One run directory per seed: runs/fedcda-regime/<setting>/seed-<k>/.
# Each run resumes where it stopped (rerun this script after an interruption).
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
for seed in ${SEEDS:-0 1 2}; do
  for alpha in 0.5 0.3; do
    for r in m1e-4-e1 m0.9-e1 m0.9-e2; do
      dir="$OUT/dir$alpha-$r/seed-$seed"
      if [[ -f "$dir/results.md" ]]; then continue; fi
      if [[ -f "$dir/config.yaml" ]]; then
        $FEDSYS resume "$dir" || echo "regime: $dir failed" >&2
      else
        # shellcheck disable=SC2086
        $FEDSYS run configs/fedcda-dir0.5.yaml --set dirichlet-alpha=$alpha --set seed=$seed \
          ${REGIME[$r]} --set output-dir="$OUT/dir$alpha-$r" --set name="seed-$seed" \
          || echo "regime: $dir failed" >&2
      fi
    done
  done
done
