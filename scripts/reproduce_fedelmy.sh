#!/usr/bin/env bash
# FedELMY against FedSeq, one-shot parallel FedAvg and parallel FedELMY on real
# Fashion-MNIST (docs/results/fedelmy.md): presets configs/fedelmy-<setting>.yaml, seeds
# 0 1 2 (or $SEEDS), one run directory per seed: runs/fedelmy/<setting>/seed-<k>/.  A run
# that was interrupted resumes where it stopped (run this script again); a finished one
# (results.md) is skipped.  Seeds are driven by scripts/reproduce_seeds.sh fedelmy (one seed
# of one setting at a time, a lock per seed, records archived to docs/results/data/ by
# scripts/seeds_report.py fedelmy); the GPU settings by scripts/gpu_units.sh.
# Usage: [SEEDS="0 1 2"] scripts/reproduce_fedelmy.sh [dir0.5 domain pool dir0.3 dir0.1 ablation fewshot]
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/fedelmy}
SEEDS=${SEEDS:-0 1 2}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.5 domain pool dir0.3 dir0.1 ablation fewshot)
for s in "${settings[@]}"; do
  for seed in ${SEEDS//,/ }; do
    dir="$OUT/$s/seed-$seed"
    if [[ -f "$dir/results.md" ]]; then continue; fi
    mkdir -p "$OUT/$s"
    if [[ -f "$dir/config.yaml" ]]; then
      $FEDSYS resume "$dir" || echo "reproduce_fedelmy: $dir failed" >&2
    else
      $FEDSYS run "configs/fedelmy-$s.yaml" --set seed="$seed" --set output-dir="$OUT/$s" \
        --set name="seed-$seed" || echo "reproduce_fedelmy: $dir failed" >&2
    fi
  done
done
