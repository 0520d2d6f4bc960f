#!/usr/bin/env bash
# FedCDA vs FedAvg on real Fashion-MNIST, four partitions, plus the Fig. 2(a)
# aggregation-strategy ablation at Dirichlet 0.3.  About 100 minutes on 2 idle CPU cores
# (40 for Dirichlet 0.3 with the ablation, 20 for each other partition).
# One preset per setting (configs/fedcda-<setting>.yaml, each equal to
# configs/fedcda-fmnist.yaml plus the --set overrides docs/results/fedcda.md lists).
# Results: runs/fedcda-*/results.md; then python scripts/fedcda_report.py.
# Usage: scripts/reproduce_fedcda.sh [dir0.3 dir0.1 dir0.5 shards2]
# Across seeds (issue 17's headline rows): SEEDS=0,1,2 scripts/reproduce_fedcda.sh dir0.1 shards2
#   runs every seed under runs/fedcda-seeds/<setting>/seed-<k>/ (resumable: run it again).
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.3 dir0.1 dir0.5 shards2)
for s in "${settings[@]}"; do
  if [[ -n ${SEEDS:-} ]]; then
    $FEDSYS run "configs/fedcda-$s.yaml" --seeds "$SEEDS" --set resume=true \
      --set output-dir=runs/fedcda-seeds --set name="$s"
  else
    $FEDSYS run "configs/fedcda-$s.yaml"
  fi
done
