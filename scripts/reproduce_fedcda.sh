#!/usr/bin/env bash
# FedCDA vs FedAvg on real Fashion-MNIST, four partitions, plus the Fig. 2(a)
# aggregation-strategy ablation at Dirichlet 0.3.  About 70 minutes on 2 CPU cores.
# Results: runs/fedcda-*/results.md, summarised in docs/results/fedcda.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
CFG=configs/fedcda-fmnist.yaml
$FEDSYS run $CFG --set name=fedcda-dir0.3 --set dirichlet-alpha=0.3 \
  --set "strategy=fedavg,fedcda,fedcda[fedcda.selection=newest],fedcda[fedcda.selection=random]"
$FEDSYS run $CFG --set name=fedcda-dir0.1 --set dirichlet-alpha=0.1
$FEDSYS run $CFG --set name=fedcda-dir0.5 --set dirichlet-alpha=0.5
$FEDSYS run $CFG --set name=fedcda-shards2 --set partition=shards --set shards-per-client=2
