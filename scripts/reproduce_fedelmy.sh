#!/usr/bin/env bash
# FedELMY against FedSeq, one-shot parallel FedAvg and parallel FedELMY on real
# Fashion-MNIST (docs/results/fedelmy.md): presets configs/fedelmy-<setting>.yaml, seeds
# 0 1 2, one run directory per seed: runs/fedelmy/<setting>/seed-<k>/.  A run that was
# interrupted resumes where it stopped (run this script again).  A chain keeps one core
# busy, so two copies side by side use both (each takes the next run the other has not
# locked): about 5 hours of 2 cores for everything; then: python scripts/seeds_report.py fedelmy
# Usage: scripts/reproduce_fedelmy.sh [dir0.5 domain pool dir0.3 dir0.1 ablation fewshot]
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/fedelmy}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.5 domain pool dir0.3 dir0.1 ablation fewshot)
for s in "${settings[@]}"; do
  for seed in ${SEEDS:-0 1 2}; do
    dir="$OUT/$s/seed-$seed"
    if [[ -f "$dir/results.md" ]]; then continue; fi
    mkdir -p "$OUT/$s"
    exec {lock}>"$dir.lock"
    if ! flock -n "$lock"; then exec {lock}>&-; continue; fi  # another stream has it
    if [[ -f "$dir/config.yaml" ]]; then
      $FEDSYS resume "$dir" || echo "reproduce_fedelmy: $dir failed" >&2
    else
      $FEDSYS run "configs/fedelmy-$s.yaml" --set seed="$seed" --set output-dir="$OUT/$s" \
        --set name="seed-$seed" || echo "reproduce_fedelmy: $dir failed" >&2
    fi
    exec {lock}>&-
  done
done
