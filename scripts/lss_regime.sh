#!/usr/bin/env bash
# The candidate regimes of configs/lss-regime.yaml: FedAvg (1 and 8 local epochs) from the
# class-balanced and the labels-only (classes 0-4) pre-trained starts, on Dirichlet 1.0,
# Dirichlet 0.1 and 2 shards per client; one run each under $OUT/<start>-<split>/ (a run
# already finished is skipped, an interrupted one resumes). Then:
#   python scripts/seeds_report.py lss-regime
set -uo pipefail
cd "$(dirname "$0")/.."
FEDSYS=${FEDSYS:-.venv/bin/fedsys}
OUT=${OUT:-runs/lss}
mkdir -p "$OUT"
for start in labels balanced; do
  pre="$OUT/pretrained.pt"; [[ $start == labels ]] && pre="$OUT/pretrained-labels.pt"
  [[ -f "$pre" ]] || $FEDSYS pretrain configs/lss-regime.yaml --set pretrain.split="$start" \
    --set pretrain.out="$pre" || exit 1
  for split in dir1.0 dir0.1 shards2; do
    case $split in
      dir1.0) part=(--set partition=dirichlet --set dirichlet-alpha=1.0) ;;
      dir0.1) part=(--set partition=dirichlet --set dirichlet-alpha=0.1) ;;
      shards2) part=(--set partition=shards --set shards-per-client=2) ;;
    esac
    dir="$OUT/regime/$start-$split"
    [[ -f "$dir/results.md" ]] && continue
    if [[ -f "$dir/config.yaml" ]]; then
      $FEDSYS resume "$dir" || echo "lss_regime: $dir failed" >&2
    else
      $FEDSYS run configs/lss-regime.yaml "${part[@]}" --set pretrain.split="$start" \
        --set init-from="$pre" --set output-dir="$OUT/regime" --set name="$start-$split" \
        || echo "lss_regime: $dir failed" >&2
    fi
  done
done
