#!/usr/bin/env bash
# Every seeded run behind docs/results/{fedcda,fedcross,ima}.md (issue 17), one seed of one
# setting at a time.  After each, scripts/seeds_report.py copies the finished runs' records to
# docs/results/data/ (kept in git, unlike runs/) and rewrites the pages' generated sections; a
# seed whose records are there already is skipped.  So the work is carried across sessions two
# ways: an interrupted seed continues from its checkpoints in runs/ (resume=true), and a
# finished one is never run again, even on a machine without that runs/ directory.
# Layout: runs/<group>/<setting>/seed-<k>/<strategy>/ (every attempt's output appended to
# runs/<group>/<setting>/seed-<k>.log), <group> one of
#   fedcda-regime   FedCDA beside FedAvg in three local-training regimes (scripts/regime_fedcda.sh)
#   fedcross-seeds  horizon: FedCross alpha 0.99 / 0.9 beside FedAvg, 300 rounds, seeds 0 1;
#                   dir0.1: FedCross, FedAvg, FedProx, seeds 0 1 2
#   fedcda-seeds    FedCDA Dirichlet 0.1 and shards 2, seeds 0 1 2
#   ima-seeds       IMA shards 2 and Dirichlet 0.3 (with their branched baselines), seeds 0 1 2
# Costs on 2 idle cores, per seed: a regime setting 22-25 minutes measured (E = 2 about twice), the horizon about
# 75 minutes, a FedCDA headline setting 25, FedCross Dirichlet 0.1 25, an IMA partition 25 (estimated);
# about 15 hours in all.  Two copies may run side by side (say, one with "headlines"): each
# seed is run by one of them (lock runs/<group>/<setting>/seed-<k>.lock, the other skips it)
# and the pages are rewritten by one at a time.  That is for a machine with cores to spare:
# on 2 cores a pair is no faster (measured 2026-11-26: a Dirichlet 0.3, E = 1 FedAvg round
# took 13.6 s alone and 28-30 s beside a second copy, which took as long), so run one.
#   fedelmy         FedELMY's CPU setting (domain shift; the others run on a GPU, scripts/gpu_units.sh)
#   lss             LSS's settings (scripts/reproduce_lss.sh pre-trains each start once first)
#   setups (issue 45): FedCDA Dirichlet 0.3 and 0.5 on the balanced split, and Dirichlet 0.3
#                   with the paper's 20 local epochs (30 rounds); FedCross with the paper's 5
#                   local epochs, Dirichlet 0.1 capped, 100 rounds; seeds 0 1 2 (about 2 h, 2 h,
#                   7.5 h and 6 h, estimated)
# Every seeded experiment goes through unit() below: one seed of one setting at a time, a
# lock per seed, a seed skipped once its records are archived, the records archived after it.
# Usage: nice -n 10 scripts/reproduce_seeds.sh [regime] [horizon] [headlines] [setups] [fedelmy] [lss]
# (not 19: beside a busy process at 0 a round then gets about 1 % of the CPU and can pass the
# 600 s round-timeout; a run with refused replies is not archived but run again, see unit).
# Beside the test suite, whose deployment tests start many sessions, give it 0: at 10 a FedAvg
# round took 8 minutes (measured 2026-11-26 during a CI run).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=docs/results/data
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(regime horizon headlines)
status=0
runs_of() {  # PRESET: the strategy runs one seed of it makes (its records per seed)
  "$PY" -c "import sys; from launch import registry; print(len(registry.load(sys.argv[1]).variants()))" "$1"
}
# unit GROUP SETTING STRATEGIES SEED COMMAND...: run COMMAND with SEEDS=SEED unless the
# records of STRATEGIES finished strategies of that seed are archived; then archive.
# SETTING may join several with "+" (one command writing three settings, IMA's): their
# records are counted together, the first names the log and the lock.
archived() {  # GROUP SETTING SEED: how many records of that seed are archived
  local n=0 part
  for part in ${2//+/ }; do
    n=$(( n + $(compgen -G "$DATA/$1-$part-s$3-*.jsonl" | wc -l) ))
  done
  echo "$n"
}
unit() {
  local group=$1 setting=$2 want=$3 seed=$4; shift 4
  # each attempt's output is appended to the seed's own log, which a later run keeps
  local first=${setting%%+*}
  local log="runs/$group/$first/seed-$seed.log" have lock plock
  mkdir -p "$(dirname "$log")"
  exec {lock}>"runs/$group/$first/seed-$seed.lock"  # held until the seed is archived
  if ! flock -n "$lock"; then  # a second copy of this script is running this seed
    exec {lock}>&-; echo "reproduce_seeds: $group/$setting seed $seed: running elsewhere, skipped"
    return 0
  fi
  have=$(archived "$group" "$setting" "$seed")
  if (( have >= want )); then
    exec {lock}>&-; echo "reproduce_seeds: $group/$setting seed $seed: archived, skipped"
    return 0
  fi
  # seeds_report.py archives the finished runs; one with refused replies (the machine stalled
  # it past round-timeout) it moves aside instead, and the seed is run again
  local attempt
  for attempt in 1 2 3; do
    echo "reproduce_seeds: $group/$setting seed $seed, attempt $attempt ($(date -u +%H:%M) UTC)"
    echo "=== $(date -u '+%F %T') UTC, $(git rev-parse --short HEAD 2>/dev/null): $*" >> "$log"
    SEEDS=$seed "$@" {lock}>&- 2>&1 | tee -a "$log" \
      || { echo "reproduce_seeds: $group/$setting seed $seed failed (log: $log)" >&2; status=1; }
    # the pages are shared between groups (fedcda.md has two generated sections): one writer
    exec {plock}>runs/.seeds-report.lock
    flock "$plock"
    "$PY" scripts/seeds_report.py "$group" > /dev/null \
      || { echo "reproduce_seeds: seeds_report.py $group failed" >&2; status=1; }
    exec {plock}>&-
    have=$(archived "$group" "$setting" "$seed")
    (( have >= want )) && break
  done
  (( have >= want )) || { echo "reproduce_seeds: $group/$setting seed $seed not archived" >&2; status=1; }
  exec {lock}>&-
}
for p in "${parts[@]}"; do
  case $p in
    regime)
      for a in 0.5 0.3; do
        for r in m1e-4-e1 m0.9-e1 m0.9-e2; do
          for k in 0 1 2; do
            unit fedcda-regime "dir$a-$r" 2 $k scripts/regime_fedcda.sh "dir$a-$r"
          done
        done
      done ;;
    horizon)
      for k in 0 1; do
        unit fedcross-seeds horizon 3 $k scripts/reproduce_fedcross.sh horizon
      done ;;
    headlines)
      for s in dir0.1 shards2; do
        for k in 0 1 2; do unit fedcda-seeds "$s" 2 $k scripts/reproduce_fedcda.sh "$s"; done
      done
      for k in 0 1 2; do unit fedcross-seeds dir0.1 3 $k scripts/reproduce_fedcross.sh dir0.1; done
      for s in shards2 dir0.3; do  # 2 IMA runs, FedAvg and the control, FedProx: 5 records
        for k in 0 1 2; do
          unit ima-seeds "$s+$s-fedavg+$s-fedprox" 5 $k scripts/reproduce_ima.sh "$s"
        done
      done ;;
    setups)  # issue 45: the papers' partitions and local work
      for s in dir0.3 dir0.5; do
        for k in 0 1 2; do
          unit fedcda-seeds "$s-balanced" 2 $k scripts/reproduce_fedcda.sh "$s"
        done
      done
      for k in 0 1 2; do
        unit fedcda-seeds dir0.3-balanced-work 2 $k scripts/reproduce_fedcda.sh dir0.3-work
      done
      for k in 0 1 2; do
        unit fedcross-seeds dir0.1-capped-work 3 $k scripts/reproduce_fedcross.sh work
      done ;;
    fedelmy)  # docs/results/fedelmy.md's CPU setting
      for k in 0 1 2; do
        unit fedelmy domain "$(runs_of configs/fedelmy-domain.yaml)" $k scripts/reproduce_fedelmy.sh domain
      done ;;
    lss)  # docs/results/lss.md (the lambda sweeps run once, at tuning seed 100: configs/lss-*lambda.yaml)
      for s in premise premise-random fmnist ingredients ablation random tuned; do
        for k in 0 1 2; do
          unit lss "$s" "$(runs_of "configs/lss-$s.yaml")" $k scripts/reproduce_lss.sh "$s"
        done
      done ;;
    *) echo "usage: $0 [regime] [horizon] [headlines] [setups] [fedelmy] [lss]" >&2; exit 2 ;;
  esac
done
exit $status
