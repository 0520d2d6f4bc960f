#!/usr/bin/env bash
# FedCross vs FedAvg and FedProx on real Fashion-MNIST (100 clients, 10 per round, 100
# rounds of 1 local epoch), three partitions; the selection-rule and alpha ablation; the
# accelerations; the long horizon. About 25 minutes per partition and 30 minutes for each of
# the ablation and the accelerations on 2 idle CPU cores: run the parts separately.
#   scripts/reproduce_fedcross.sh [main|dir0.1|dir0.5|iid|ablation|accel|horizon|work|all]
# SEEDS=0,1,2 runs a partition once per seed under runs/fedcross-seeds/<partition>/seed-<k>/
# (resumable: run it again).  "horizon" (issue 17): Dirichlet 0.5, FedAvg beside FedCross at
# alpha 0.99 and 0.9, 300 rounds, seeds ${SEEDS:-0,1}: runs/fedcross-seeds/horizon/ (about 2.5 hours).
# "work" (issue 45): the paper's local work per round, 5 epochs (batch 50, lr 0.01, momentum 0.5
# as the preset), Dirichlet 0.1 on the preset's split (dirichlet-capped, the authors' code),
# FedAvg, FedProx and FedCross for WORK_ROUNDS rounds (default 100; the paper: 2,000), seeds
# ${SEEDS:-0,1,2}: runs/fedcross-seeds/dir0.1-capped-work/ (about 2 hours a seed, estimated from
# the preset's 25 minutes at 1 epoch).
# Then: python scripts/fedcross_report.py (tables for docs/results/fedcross.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
CFG=configs/fedcross-fmnist.yaml
part=${1:-all}
# The partitions, ablation, accelerations and horizon are the rows of docs/results/fedcross.md,
# measured on partition: dirichlet before the presets moved to the authors' dirichlet-capped
# (issue 45): OLD pins that split so that they repeat; "work" runs on the presets' own.
OLD=(--set partition=dirichlet)
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
  partition dir0.1 "${OLD[@]}" --set dirichlet-alpha=0.1
fi
if [[ $part == all || $part == main || $part == dir0.5 ]]; then
  partition dir0.5 "${OLD[@]}" --set dirichlet-alpha=0.5
fi
if [[ $part == all || $part == main || $part == iid ]]; then
  partition iid --set partition=iid
fi
if [[ $part == all || $part == ablation ]]; then
  $FEDSYS run configs/fedcross-ablation.yaml "${OLD[@]}"
fi
if [[ $part == all || $part == accel ]]; then
  $FEDSYS run configs/fedcross-accel.yaml "${OLD[@]}"
fi
if [[ $part == horizon ]]; then
  $FEDSYS run $CFG "${OLD[@]}" --set dirichlet-alpha=0.5 --set num-server-rounds=300 \
    --set "strategy=fedavg,fedcross,fedcross[fedcross.alpha=0.9]" \
    --seeds "${SEEDS:-0,1}" --set resume=true --set output-dir=runs/fedcross-seeds --set name=horizon
fi
if [[ $part == work ]]; then
  $FEDSYS run $CFG --set dirichlet-alpha=0.1 --set local-epochs=5 \
    --set num-server-rounds="${WORK_ROUNDS:-100}" --seeds "${SEEDS:-0,1,2}" --set resume=true \
    --set output-dir=runs/fedcross-seeds --set name=dir0.1-capped-work
fi
