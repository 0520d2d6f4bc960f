#!/usr/bin/env bash
# Every preset of configs/ at 3 rounds with one checkout of fedsys: the "before" or the
# "after" half of a refactor's proof (issue 43 item 5, issue 44 item 2).  Compare two such
# trees with scripts/metrics_identical.py (every number of every round, every final model).
#
#   git worktree add --detach /tmp/before <old commit>
#   scripts/presets_identical.sh /tmp/before /tmp/cmp/before &
#   scripts/presets_identical.sh "$PWD" /tmp/cmp/after &      # both at once on 2 cores
#   wait; python scripts/metrics_identical.py /tmp/cmp/before /tmp/cmp/after
#
# Each preset runs with PYTHONPATH=CHECKOUT from CHECKOUT (its log in OUT-logs/<preset>.log;
# a preset whose log says it finished is skipped, so the script resumes).  Overrides, the
# same for both halves: configs/default.yaml in full; the others num-server-rounds=3; a
# warm-up that would cover 3 rounds (refused by the run) made 1 (FedCDA's; its paper-schedule
# preset at 1 local epoch, not 20: 20 minutes a round here), FedCross's
# acceleration windows scaled to 3 rounds, IMA's smoke start at round 1; the FedELMY chains
# with 3 clients (a round is a hop, the chain visits every client) and, with the LSS
# presets, 300 samples a client and 1,000 test images (at their sizes a chain preset takes
# 20+ minutes on 2 cores); the LSS presets start from the same saved pre-trained models,
# copied from PRETRAINED (default: this repository's runs/lss; `fedsys pretrain
# configs/lss-fmnist.yaml` writes one).  FEDSYS: the fedsys command, words split on spaces
# (default: this repository's .venv/bin/python -m fedsys_launch, which runs each checkout's
# own command whatever entry point the venv's console script names).  About 60 minutes per
# half with both halves side by side here.
# ENGINE: the simulation engine of every run (the config key 'engine': flower or inprocess;
# default: the config's), so that one checkout run twice compares the engines (inprocess
# with batch-clients=false, one client at a time, unless BATCH names another value: batched
# clients are equal to float rounding only); PRESETS: the
# presets to run, by name, space-separated (default: all).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
checkout=$(cd "${1:?usage: scripts/presets_identical.sh CHECKOUT OUT}" && pwd)
out=${2:?usage: scripts/presets_identical.sh CHECKOUT OUT}
mkdir -p "$out" "$out-logs"; out=$(cd "$out" && pwd)
read -ra fedsys <<< "${FEDSYS:-$here/.venv/bin/python -m fedsys_launch}"
pretrained=${PRETRAINED:-$here/runs/lss}
cd "$checkout"; export PYTHONPATH="$checkout"
mkdir -p runs/lss
for f in pretrained.pt pretrained-labels.pt; do
  # copied under a name of its own, then renamed: the two halves started side by side in one
  # checkout copy at once (one of them warned that the file was missing)
  [ -e "runs/lss/$f" ] || { cp "$pretrained/$f" "runs/lss/.$f.$$" 2>/dev/null \
    && mv -f "runs/lss/.$f.$$" "runs/lss/$f"; } \
    || echo "warning: no $pretrained/$f: the LSS presets that start from it will fail"
done
small=(--set samples-per-client=300 --set test-subset=1000)
failed=0
engine=(); [ -n "${ENGINE:-}" ] && engine=(--set "engine=$ENGINE")
[ "${ENGINE:-}" = inprocess ] && engine+=(--set "batch-clients=${BATCH:-false}")
for c in configs/*.yaml; do n=$(basename "$c" .yaml)
  [ -n "${PRESETS:-}" ] && [[ " $PRESETS " != *" $n "* ]] && continue
  grep -q "finished: results" "$out-logs/$n.log" 2>/dev/null && continue
  case $n in
    default) extra=() ;;
    fedcda-paper-*) extra=(--set num-server-rounds=3 --set fedcda.warmup=1 --set local-epochs=1) ;;
    fedcda-*) extra=(--set num-server-rounds=3 --set fedcda.warmup=1) ;;
    fedcross-accel) extra=(--set num-server-rounds=3 --set "strategy=fedcross[fedcross.warmup=1],fedcross[fedcross.propeller-rounds=2],fedcross[fedcross.dynamic-alpha-rounds=2],fedcross[fedcross.propeller-rounds=1;fedcross.dynamic-alpha-rounds=1]") ;;
    fedelmy-*) extra=(--set num-server-rounds=3 --set num-clients=3 --set clients-per-round=3 "${small[@]}") ;;
    lss-*) extra=(--set num-server-rounds=3 "${small[@]}") ;;
    ima-smoke) extra=(--set num-server-rounds=3 --set ima.start-round=1) ;;
    *) extra=(--set num-server-rounds=3) ;;
  esac
  echo "== $n ${extra[*]} $(date +%T)"
  rm -rf "${out:?}/$n"
  "${fedsys[@]}" run "$c" "${extra[@]}" "${engine[@]}" --set "name=$n" --set "output-dir=$out" > "$out-logs/$n.log" 2>&1 \
    || { echo "FAILED $n (see $out-logs/$n.log)"; failed=1; }
done
echo "== done $(date +%T)"
exit $failed
