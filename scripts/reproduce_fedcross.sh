#!/usr/bin/env bash
# FedCross vs FedAvg and FedProx on real Fashion-MNIST (100 clients, 10 per round, 100
# rounds of 1 local epoch), three partitions; the selection-rule and alpha ablation; the
# accelerations; the long horizon. About 25 minutes per partition and 30 minutes for each of
# the ablation and the accelerations on 2 idle CPU cores: run the parts separately.
#   scripts/reproduce_fedcross.sh [main|dir0.1|dir0.5|iid|ablation|accel|horizon|all]
# SEEDS=0,1,2 runs a partition once per seed under runs/fedcross-seeds/<partition>/seed-<k>/
# (resumable: run it again).  "horizon" (issue 17): Dirichlet 0.5, FedAvg beside FedCross at
# alpha 0.99 and 0.9, 300 rounds, seeds ${SEEDS:-0,1}: runs/fedcross-seeds/horizon/ (about 2.5 hours).
# Then: python scripts/fedcross_report.py (tables for docs/results/fedcross.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
CFG=configs/fedcross-fmnist.yaml
part=${1:-all}
partition() {  # name, then the --set overrides of that partition
  local name=$1; shift
  if [[ -n ${SEEDS:-} ]]; then
    $FEDSYS run $CFG "$@" --seeds "$SEEDS" --set resume=true --set output-dir=runs/fedcross-seeds \
      --set name="$name"
  else
    $FEDSYS run $CFG "$@" --set name="fedcross-$name"
  fi
}
if [[ $part == all || $part == main || $part == dir0.1 ]]; then
  partition dir0.1 --set dirichlet-alpha=0.1
fi
if [[ $part == all || $part == main || $part == dir0.5 ]]; then
  partition dir0.5 --set dirichlet-alpha=0.5
fi
if [[ $part == all || $part == main || $part == iid ]]; then
  partition iid --set partition=iid
fi
if [[ $part == all || $part == ablation ]]; then
  $FEDSYS run configs/fedcross-ablation.yaml
fi
if [[ $part == all || $part == accel ]]; then
  $FEDSYS run configs/fedcross-accel.yaml
fi
if [[ $part == horizon ]]; then
  $FEDSYS run $CFG --set dirichlet-alpha=0.5 --set num-server-rounds=300 \
    --set "strategy=fedavg,fedcross,fedcross[fedcross.alpha=0.9]" \
    --seeds "${SEEDS:-0,1}" --set resume=true --set output-dir=runs/fedcross-seeds --set name=horizon
fi
