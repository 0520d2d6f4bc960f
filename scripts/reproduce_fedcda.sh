#!/usr/bin/env bash
# FedCDA vs FedAvg on real Fashion-MNIST, four partitions, plus the Fig. 2(a)
# aggregation-strategy ablation at Dirichlet 0.3.  About 100 minutes on 2 idle CPU cores
# (40 for Dirichlet 0.3 with the ablation, 20 for each other partition).
# One preset per setting (configs/fedcda-<setting>.yaml, each equal to
# configs/fedcda-fmnist.yaml plus the --set overrides docs/results/fedcda.md lists).
# Results: runs/fedcda-*/results.md; then python scripts/fedcda_report.py.
# Usage: scripts/reproduce_fedcda.sh [dir0.3 dir0.1 dir0.5 shards2]
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.3 dir0.1 dir0.5 shards2)
for s in "${settings[@]}"; do
  $FEDSYS run "configs/fedcda-$s.yaml"
done
