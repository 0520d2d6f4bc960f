#!/usr/bin/env bash
# FedCDA vs FedAvg on real Fashion-MNIST, four partitions, plus the Fig. 2(a)
# aggregation-strategy ablation at Dirichlet 0.3.  About 100 minutes on 2 idle CPU cores
# (40 for Dirichlet 0.3 with the ablation, 20 for each other partition).
# One preset per setting (configs/fedcda-<setting>.yaml, each equal to
# configs/fedcda-fmnist.yaml plus the --set overrides docs/results/fedcda.md lists).
# Results: runs/fedcda-*/results.md; then python scripts/fedcda_report.py.
# Usage: scripts/reproduce_fedcda.sh [dir0.3 dir0.1 dir0.5 shards2]
# Across seeds (issue 17's headline rows): SEEDS=0,1,2 scripts/reproduce_fedcda.sh dir0.1 shards2
#   runs FedAvg and FedCDA of every seed under runs/fedcda-seeds/<setting>/seed-<k>/
#   (resumable: run it again).  A preset on the balanced split (partition: dirichlet-balanced,
#   issue 45) runs as setting <setting>-balanced; the records before it (dir0.1) used
#   partition: dirichlet.
# The paper's local work per round (issue 45): a setting <preset>-work, e.g. dir0.3-work, runs
#   the preset with 20 local epochs at lr 1e-3 (batch 64, momentum 1e-4 as the preset) for
#   WORK_ROUNDS rounds (default 30; the paper: 200), FedCDA's warmup a quarter of them (the
#   paper's 50 of 200).  About 2.5 minutes a round per strategy on 2 idle cores (estimated from
#   the preset's 10 s a round at 1 epoch), so 30 rounds of FedAvg and FedCDA take about 2.5 hours
#   a seed.
set -euo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
settings=("$@")
[[ ${#settings[@]} -gt 0 ]] || settings=(dir0.3 dir0.1 dir0.5 shards2)
for s in "${settings[@]}"; do
  preset=${s%-work}
  extra=()
  if [[ $s == *-work ]]; then
    rounds=${WORK_ROUNDS:-30}
    extra=(--set local-epochs=20 --set lr=0.001 --set num-server-rounds="$rounds"
           --set fedcda.warmup=$(( rounds / 4 )))
  fi
  # runs on the balanced split are named <preset>-balanced[-work]: the names without it hold
  # the runs on partition: dirichlet that docs/results/fedcda.md reports
  name=$s
  if grep -q '^partition: dirichlet-balanced$' "configs/fedcda-$preset.yaml"; then
    name=$preset-balanced${s#"$preset"}
  fi
  if [[ -n ${SEEDS:-} ]]; then
    $FEDSYS run "configs/fedcda-$preset.yaml" "${extra[@]}" --seeds "$SEEDS" --set resume=true \
      --set strategy=fedavg,fedcda --set output-dir=runs/fedcda-seeds --set name="$name"
  else
    $FEDSYS run "configs/fedcda-$preset.yaml" "${extra[@]}" --set name="fedcda-$name"
  fi
done
