#!/usr/bin/env bash
# Issue 64's GPU rows in one go, for a lent device (../shared/gpu/README.md): run it first in
# a session that has one, as the device tool's one command, with the bundle carried:
#
#   echo /.gpu/ >> .git/info/exclude; ../shared/gpu/make-bundle.sh .gpu 23000
#   run(command="bash scripts/gpu_issue64.sh", carry=[".gpu"], timeout_s=600)
#
# 1. throughput (issue 64 item 5, target: at least 300,000 samples/s on an H100/H200): the
#    FMNIST CNN cross-device round (100 clients, all sampled, 1 local epoch at batch 32) on
#    the batched in-process engine against Flower's engine with fractional GPUs
#    (client-num-gpus 0.1) and the floor (a plain PyTorch loop on the GPU), one after the
#    other: benchmarks/cross_device.py --cnn --set device=cuda, its table with samples/s;
# 2. FedCDA against FedAvg at the paper's Table 1 schedule (configs/fedcda-paper-dir0.3.yaml:
#    200 rounds of 20 local epochs, balanced Dirichlet 0.3, 20 clients, 4 a round), 3 seeds,
#    on the batched in-process engine, the six runs at once (scripts/gpu_units.sh); what
#    finishes within the time left is reported, what does not says how far it got.
#
# What comes back ($OUT, the device tool's folder: at most 8 files, 2 folders down):
# summary.md (the tables, each step's outcome), throughput.log, and results.tar.gz (every
# run's metrics.jsonl, finished or cut off, the benchmark's records, the runs' logs).
# The work itself stays in .gpu-work/ (git-ignored: kept on a warm device machine between
# calls): run the same command again on the same machine and it goes on, the throughput
# step not repeated, each cut-off run from its last checkpoint (every 10 rounds), for
# what BUDGET leaves it (a second call: BUDGET=<seconds the lease has left, less a margin>).
# A dry run on the CPU (minutes):
#   PATH=.venv/bin:$PATH DEVICE=cpu QUICK=1 OUT=/tmp/i64 bash scripts/gpu_issue64.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/issue64}
WORK=${WORK:-.gpu-work}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}            # set: a few rounds of each, for trying the script on the CPU
BUDGET=${BUDGET:-570}       # seconds for the whole script: under the device tool's 600 s a call
# SECONDS_FEDCDA: step 2's time; unset, what BUDGET leaves after steps 1 and 1b (at most
# 200 + 150 s) less 30 s for the report and the archive
mkdir -p "$OUT" "$WORK"
if [[ -f .gpu/setup.sh ]]; then source .gpu/setup.sh; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, for the scripts' imports
export FEDSYS=${FEDSYS:-python3 -m fedsys_launch.commands.cli}
start=$SECONDS
say() { echo "[$((SECONDS - start)) s] $*" | tee -a "$OUT/summary.md"; }
# the GPU's utilisation while a step runs (nvidia-smi once a second into $WORK/gpu-NAME.csv):
# whether the step kept the chip busy or waited on the host; its mean goes in the summary
watcher= watched=
watch_gpu() {  # NAME
  command -v nvidia-smi > /dev/null || return 0
  watched="$WORK/gpu-$1.csv"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
    > "$watched" 2>/dev/null &
  watcher=$!
}
stop_gpu() {  # WHAT (for the summary)
  [[ -n $watcher ]] || return 0
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; watcher=
  say "   GPU during $1: $(awk -F', *' '$1 ~ /^[0-9]+$/ {u += $1; if ($2 > m) m = $2; n++}
    END {if (n) printf "utilisation %.0f %% (mean of %d samples a second apart), memory up to %d MiB",
    u / n, n, m; else print "no samples"}' "$watched")"
}

say "device: $DEVICE $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], \
'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$OUT/summary.md"

# 1. throughput (once: an earlier call's table stands)
if [[ -n $QUICK ]]; then rounds=2; extra=(--set samples-per-client=20)
else rounds=4; extra=(); fi
variants=inprocess-batched,flower
client_gpus=0.1; [[ $DEVICE == cpu ]] && client_gpus=0  # a CPU dry run has no GPU to share
if grep -q '^| engine' "$WORK/throughput.log" 2>/dev/null; then
  say "1. throughput: measured by an earlier call on this machine"
else
  say "1. throughput: benchmarks/cross_device.py --cnn --rounds $rounds --set device=$DEVICE"
  rm -rf "$WORK/xd"
  watch_gpu throughput
  timeout 200 python3 benchmarks/cross_device.py --cnn --rounds "$rounds" --set device="$DEVICE" \
      --set client-num-gpus="$client_gpus" "${extra[@]}" --only "$variants" --out "$WORK/xd" \
      > "$WORK/throughput.log" 2>&1
  say "throughput exit $?"
  stop_gpu "step 1 (both engines and the floor)"
  find "$WORK/xd" \( -name '*.pt' -o -name '*.png' \) -delete 2>/dev/null
  python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
fi
cp "$WORK/throughput.log" "$OUT/throughput.log"
sed -n '/^| engine/,$p' "$OUT/throughput.log" | tee -a "$OUT/summary.md"
grep -q '^| engine' "$OUT/throughput.log" || tail -5 "$OUT/throughput.log"

# 1b. where the batched GPU round's time goes: the training (BatchTraining.train, the samples/s
#     of the training itself) against the messages, checks and aggregation around it
if grep -q '^| round-time' "$WORK/parts.log" 2>/dev/null; then
  say "1b. round parts: measured by an earlier call on this machine"
else
  say "1b. round parts: benchmarks/round_parts.py --only kept (the CNN setting, device $DEVICE)"
  parts=(--set model=fmnist-cnn --set num-clients=100 --set clients-per-round=100 --set lr=0.01
         --set device="$DEVICE")
  [[ -n $QUICK ]] && parts+=(--set samples-per-client=20)
  watch_gpu parts
  timeout 150 python3 benchmarks/round_parts.py --only kept --rounds "$((rounds + 1))" \
      "${parts[@]}" > "$WORK/parts.log" 2>&1
  say "round parts exit $?"
  stop_gpu "step 1b (the batched engine alone)"
fi
sed -n '/^| ms a round/,$p' "$WORK/parts.log" | tee -a "$OUT/summary.md"
grep -q '^| round-time' "$WORK/parts.log" || tail -5 "$WORK/parts.log"

# 2. FedCDA against FedAvg at Table 1's schedule, 3 seeds, six runs at once
if [[ -n $QUICK ]]; then sched=(--set num-server-rounds=3 --set local-epochs=1 --set fedcda.warmup=1
  --set checkpoint-every=1)
else sched=(); fi
say "2. FedCDA vs FedAvg, configs/fedcda-paper-dir0.3.yaml, seeds 0 1 2, engine inprocess (batched)"
SECONDS_FEDCDA=${SECONDS_FEDCDA:-$((BUDGET - (SECONDS - start) - 30))}
(( SECONDS_FEDCDA >= 30 )) || SECONDS_FEDCDA=30  # steps 1 and 1b overran: still a start
say "   step 2 gets $SECONDS_FEDCDA s"
watch_gpu "table1-$(date +%H%M%S)"
SEEDS="0 1 2" JOBS=6 DEVICE="$DEVICE" GPUS=0 OUT_RUNS="$WORK/runs" \
  EXTRA="--set engine=inprocess --set batch-clients=true --set checkpoint-every=10 ${sched[*]}" \
  timeout "$SECONDS_FEDCDA" bash scripts/gpu_units.sh fedcda paper-dir0.3 2>&1 | tee -a "$OUT/summary.md"
stop_gpu "step 2 (six runs at once)"
sleep 5  # the cut runs' last writes
rm -rf "$WORK/partial"; mkdir -p "$WORK/partial"
for d in "$WORK"/runs/.tmp/*/; do  # a unit the time cut keeps its folder: how far it got
  m=$(find "$d" -mindepth 3 -maxdepth 3 -name metrics.jsonl 2>/dev/null | head -1)
  [[ -n $m ]] || continue
  c=$(dirname "$m")/checkpoint.pt
  say "unfinished $(basename "$d"): last round recorded $(tail -1 "$m" | python3 -c \
    'import json, sys; print(json.loads(sys.stdin.read()).get("round"))')$([[ -f $c ]] \
    && echo ", a checkpoint to go on from" || echo ", no checkpoint yet")"
  cp "$m" "$WORK/partial/$(basename "$d").jsonl"
done
python3 - "$WORK/runs" "$WORK/partial" <<'PY' 2>&1 | tee -a "$OUT/summary.md"
import json, statistics, sys
from pathlib import Path
done = [(f, f.parent.name, f.parent.parent.name, "")
        for f in sorted(Path(sys.argv[1]).glob("*/seed-*/*/metrics.jsonl"))]
cut = [(f, f.stem.rsplit("-", 2)[2], "seed-" + f.stem.rsplit("-", 2)[1], " (cut off)")
       for f in sorted(Path(sys.argv[2]).glob("*.jsonl"))]
print("| strategy | seed | rounds | accuracy, last 10 rounds (mean ± sd) |")
print("| --- | --- | --- | --- |")
for f, label, seed, note in sorted(done + cut, key=lambda t: (t[1], t[2])):
    recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    acc = [100 * r["accuracy"] for r in recs if r.get("round", 0) > 0 and "accuracy" in r]
    if acc:
        last = acc[-10:]
        print(f"| {label} | {seed} | {len(acc)}{note} | {statistics.mean(last):.2f} ± "
              f"{statistics.pstdev(last):.2f} |")
PY
# everything else in one file (the device tool brings back 8 files, 2 folders down)
tar czf "$OUT/results.tar.gz" --exclude='*.pt' --exclude='*.png' --exclude='.fedsys.lock' \
  -C "$WORK" throughput.log parts.log xd runs partial $(cd "$WORK" && ls gpu-*.csv 2>/dev/null) \
  2>&1 | tail -3
say "results.tar.gz: $(du -k "$OUT/results.tar.gz" 2>/dev/null | cut -f1) KB"
say "done"
