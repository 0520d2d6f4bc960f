#!/usr/bin/env bash
# Every seeded run behind docs/results/{fedcda,fedcross,ima}.md (issue 17), one after another,
# each resumable: run this script again after an interruption and it goes on where it stopped
# (finished settings are skipped, an unfinished seed continues from its checkpoint).
# Layout: runs/<method>-regime|-seeds/<setting>/seed-<k>/<strategy>/ (scripts/seeds_report.py).
#   regime     FedCDA beside FedAvg in three local-training regimes (scripts/regime_fedcda.sh)
#   horizon    FedCross alpha 0.99 / 0.9 beside FedAvg, 300 rounds, 2 seeds
#   headlines  FedCDA Dirichlet 0.1 and shards 2, FedCross Dirichlet 0.1, IMA shards 2 and
#              Dirichlet 0.3, seeds 0 1 2
# About 15 hours of 2 idle cores in all.  Usage: nice -n 19 scripts/reproduce_seeds.sh [part...]
set -uo pipefail
cd "$(dirname "$0")"
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(regime horizon headlines)
done_or_run() {  # results.md of a finished run; otherwise the command
  local results=$1; shift
  [[ -f ../$results ]] || "$@" || echo "reproduce_seeds: $* failed" >&2
}
for p in "${parts[@]}"; do
  case $p in
    regime) ./regime_fedcda.sh ;;
    horizon) done_or_run runs/fedcross-seeds/horizon/results.md ./reproduce_fedcross.sh horizon ;;
    headlines)
      for s in dir0.1 shards2; do
        done_or_run "runs/fedcda-seeds/$s/results.md" env SEEDS=0,1,2 ./reproduce_fedcda.sh "$s"
      done
      done_or_run runs/fedcross-seeds/dir0.1/results.md env SEEDS=0,1,2 ./reproduce_fedcross.sh dir0.1
      for s in shards2 dir0.3; do
        done_or_run "runs/ima-seeds/$s-fedprox/results.md" env SEEDS=0,1,2 ./reproduce_ima.sh "$s"
      done ;;
    *) echo "usage: $0 [regime] [horizon] [headlines]" >&2; exit 2 ;;
  esac
done
