#!/usr/bin/env bash
# Local Superior Soups against FedAvg and FedProx on real Fashion-MNIST from a pre-trained
# start (docs/results/lss.md): first `fedsys pretrain` (once per start, shared by every
# seed and method: runs/lss/pretrained.pt, pretrained-labels.pt), then presets configs/lss-<setting>.yaml, seeds 0 1 2
# (or $SEEDS), one run directory per seed: runs/lss/<setting>/seed-<k>/.  An interrupted run
# resumes (run this script again); a finished one (results.md) is skipped.  Seeds are driven
# by scripts/reproduce_seeds.sh lss (one seed of one setting at a time, a lock per seed,
# records archived to docs/results/data/ by scripts/seeds_report.py lss).
# Usage: [SEEDS="0 1 2"] scripts/reproduce_lss.sh [fmnist ingredients ablation random tuned premise premise-random]
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/lss}
SEEDS=${SEEDS:-0 1 2}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(fmnist ingredients ablation random tuned premise premise-random)
mkdir -p "$OUT"
# each preset's pre-trained start (its init-from: runs/lss/<file>), trained once under a lock
start_of() { sed -n 's/^init-from: runs\/lss\/\(.*\)$/\1/p' "configs/lss-$1.yaml"; }
for s in "${settings[@]}"; do
  pre=$(start_of "$s"); [[ -n "$pre" ]] || continue
  exec {plock}>"$OUT/$pre.lock"
  flock "$plock"
  [[ -f "$OUT/$pre" ]] || $FEDSYS pretrain "configs/lss-$s.yaml" --set pretrain.out="$OUT/$pre" || exit 1
  exec {plock}>&-
done
for s in "${settings[@]}"; do
  for seed in ${SEEDS//,/ }; do
    dir="$OUT/$s/seed-$seed"
    if [[ -f "$dir/results.md" ]]; then continue; fi
    mkdir -p "$OUT/$s"
    sets=(--set seed="$seed" --set output-dir="$OUT/$s" --set name="seed-$seed")
    pre=$(start_of "$s")
    [[ -n "$pre" ]] && sets+=(--set init-from="$OUT/$pre")
    if [[ -f "$dir/config.yaml" ]]; then
      $FEDSYS resume "$dir" || echo "reproduce_lss: $dir failed" >&2
    else
      $FEDSYS run "configs/lss-$s.yaml" "${sets[@]}" || echo "reproduce_lss: $dir failed" >&2
    fi
  done
done
