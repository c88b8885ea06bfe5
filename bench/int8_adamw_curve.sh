#!/usr/bin/env bash
# 8-bit AdamW against fp32 AdamW on the same run (issue 51, acceptance 2):
# examples/fortunes-ddp.yaml (4 CPU ranks, DDP) for STEPS steps with
# optimizer.state fp32, then int8, everything else equal; prints both loss
# curves every 25 steps, the validation losses, the final losses' ratio and
# the optimizer state each plan counts.
#   bench/int8_adamw_curve.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-300}
cli="$build/bin/shardtrain"
spec=examples/fortunes-ddp.yaml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for state in fp32 int8; do
  echo "== optimizer.state $state; planned per rank: $("$cli" plan "$spec" --set optimizer.state=$state \
    | grep -m1 ' optimizer$' | sed 's/^ *//')"
  "$cli" local "$spec" --set steps="$steps" --set optimizer.state=$state \
    --set checkpoint.dir="$out/ckpt-$state" -o json >"$out/$state.json"
done
python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
runs = {k: {s["step"]: s for s in json.load(open(f"{out}/{k}.json"))["steps"]} for k in ("fp32", "int8")}
print(f"{'step':>5} {'fp32 loss':>10} {'int8 loss':>10} {'fp32 val':>9} {'int8 val':>9}")
for step in sorted(runs["fp32"]):
    a, b = runs["fp32"][step], runs["int8"].get(step, {})
    if step % 25 and step != 1 and "val_loss" not in a:
        continue
    val = lambda r: f"{r['val_loss']:9.4f}" if "val_loss" in r else " " * 9
    print(f"{step:5d} {a['loss']:10.4f} {b.get('loss', float('nan')):10.4f} {val(a)} {val(b)}")
def tail_mean(r):
    last = sorted(r)[-20:]
    return sum(r[s]["loss"] for s in last) / len(last)
fa, fb = runs["fp32"][steps], runs["int8"][steps]
print(f"final loss: fp32 {fa['loss']:.4f}, int8 {fb['loss']:.4f} (int8/fp32 {fb['loss'] / fa['loss']:.4f}); "
      f"mean of the last 20 steps: {tail_mean(runs['fp32']):.4f} vs {tail_mean(runs['int8']):.4f} "
      f"({tail_mean(runs['int8']) / tail_mean(runs['fp32']):.4f})")
print(f"final val_loss: fp32 {fa['val_loss']:.4f}, int8 {fb['val_loss']:.4f} (int8/fp32 {fb['val_loss'] / fa['val_loss']:.4f})")
PY
