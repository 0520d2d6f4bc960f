#!/usr/bin/env bash
# FedCross vs FedAvg and FedProx on real Fashion-MNIST (100 clients, 10 per round, 100
# rounds of 1 local epoch), three partitions; the selection-rule and alpha ablation; the
# accelerations. About 25 minutes per partition and 30 minutes for each of the ablation and
# the accelerations on 2 idle CPU cores: run the parts separately (main, ablation, accel).
# Then: python scripts/fedcross_report.py (tables for docs/results/fedcross.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
part=${1:-all}
if [[ $part == all || $part == main ]]; then
  $FEDSYS run configs/fedcross-fmnist.yaml --set name=fedcross-dir0.1 --set dirichlet-alpha=0.1
  $FEDSYS run configs/fedcross-fmnist.yaml --set name=fedcross-dir0.5 --set dirichlet-alpha=0.5
  $FEDSYS run configs/fedcross-fmnist.yaml --set name=fedcross-iid --set partition=iid
fi
if [[ $part == all || $part == ablation ]]; then
  $FEDSYS run configs/fedcross-ablation.yaml
fi
if [[ $part == all || $part == accel ]]; then
  $FEDSYS run configs/fedcross-accel.yaml
fi
