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
# Everything worth keeping goes to $OUT (the device tool's folder: it comes back), small:
# the tables, each run's metrics.jsonl, the logs' tails.  A dry run on the CPU (minutes):
#   PATH=.venv/bin:$PATH DEVICE=cpu QUICK=1 OUT=/tmp/i64 bash scripts/gpu_issue64.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/issue64}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}            # set: a few rounds of each, for trying the script on the CPU
SECONDS_FEDCDA=${SECONDS_FEDCDA:-330}  # with the throughput step (at most 200 s): under the device tool's 600 s a call
mkdir -p "$OUT"
if [[ -f .gpu/setup.sh ]]; then source .gpu/setup.sh; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, for the scripts' imports
export FEDSYS=${FEDSYS:-python3 -m fedsys_launch.cli}
start=$SECONDS
say() { echo "[$((SECONDS - start)) s] $*" | tee -a "$OUT/summary.md"; }

say "device: $DEVICE $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], \
'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$OUT/summary.md"

# 1. throughput
if [[ -n $QUICK ]]; then rounds=2; extra=(--set samples-per-client=20)
else rounds=4; extra=(); fi
variants=inprocess-batched,flower
client_gpus=0.1; [[ $DEVICE == cpu ]] && client_gpus=0  # a CPU dry run has no GPU to share
say "1. throughput: benchmarks/cross_device.py --cnn --rounds $rounds --set device=$DEVICE"
timeout 200 python3 benchmarks/cross_device.py --cnn --rounds "$rounds" --set device="$DEVICE" \
    --set client-num-gpus="$client_gpus" "${extra[@]}" --only "$variants" --out "$OUT/xd" \
    > "$OUT/throughput.log" 2>&1
say "throughput exit $?"
sed -n '/^| engine/,$p' "$OUT/throughput.log" | tee -a "$OUT/summary.md"
grep -q '^| engine' "$OUT/throughput.log" || tail -5 "$OUT/throughput.log"
find "$OUT/xd" \( -name '*.pt' -o -name '*.png' \) -delete 2>/dev/null
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1

# 2. FedCDA against FedAvg at Table 1's schedule, 3 seeds, six runs at once
if [[ -n $QUICK ]]; then sched=(--set num-server-rounds=3 --set local-epochs=1 --set fedcda.warmup=1)
else sched=(); fi
say "2. FedCDA vs FedAvg, configs/fedcda-paper-dir0.3.yaml, seeds 0 1 2, engine inprocess (batched)"
SEEDS="0 1 2" JOBS=6 DEVICE="$DEVICE" GPUS=0 OUT_RUNS="$OUT/runs" \
  EXTRA="--set engine=inprocess --set batch-clients=true --set checkpoint-every=1000 ${sched[*]}" \
  timeout "$SECONDS_FEDCDA" bash scripts/gpu_units.sh fedcda paper-dir0.3 2>&1 | tee -a "$OUT/summary.md"
for d in "$OUT"/runs/.tmp/*/; do  # a unit the time cut keeps its strategy's folder: how far it got
  m=$(find "$d" -mindepth 3 -maxdepth 3 -name metrics.jsonl 2>/dev/null | head -1)
  [[ -n $m ]] || continue
  say "unfinished $(basename "$d"): last round recorded $(tail -1 "$m" | python3 -c \
    'import json, sys; print(json.loads(sys.stdin.read()).get("round"))')"
  cp "$m" "$OUT/runs/$(basename "$d").partial.jsonl"
done
rm -rf "$OUT/runs/.tmp"
find "$OUT/runs" \( -name '*.pt' -o -name '*.png' \) -delete 2>/dev/null
python3 - "$OUT/runs" <<'PY' 2>&1 | tee -a "$OUT/summary.md"
import json, statistics, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("*/seed-*/*/metrics.jsonl")):
    recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    acc = [100 * r["accuracy"] for r in recs if r.get("round", 0) > 0 and "accuracy" in r]
    last = acc[-10:]
    rows.setdefault(f.parent.name, []).append((f.parent.parent.name, len(acc), statistics.mean(last),
                                               statistics.pstdev(last)))
for label, rs in rows.items():
    for seed, n, m, s in rs:
        print(f"| {label} | {seed} | {n} rounds | last-10 {m:.2f} ± {s:.2f} |")
PY
say "done"
