#!/usr/bin/env bash
# compare_revisions.sh BASE_REV [ROUNDS]
#
# The same benchmarks at two revisions, in one run: builds BASE_REV's
# train_step_bench and ddp_scaling_bench in a scratch worktree (reusing its
# build directory between calls), then runs BASE_REV's and this tree's
# binaries alternately, ROUNDS times each (default 3), so both see the same
# machine load. Prints each round's figures and the median of each side with
# the ratio this tree / BASE_REV. A benchmark, not a test: nothing passes or
# fails.
#
#   train_step_bench --only small --steps 30    ms per training step (1 rank)
#   ddp_scaling_bench --quick --no-torch        ms per step, 1 rank x 2 threads
#                                               and 2 ranks x 1 thread (DDP)
#
# This tree must be built (scripts/build). Example: bench/compare_revisions.sh HEAD~5 3
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bench/compare_revisions.sh BASE_REV [ROUNDS]" >&2; exit 2; }
base=$(git rev-parse --verify "$1^{commit}")
rounds=${2:-3}
scratch=${SHARDTRAIN_AB_DIR:-/tmp/shardtrain-ab}
new_bin=build/bench
for b in train_step_bench ddp_scaling_bench; do
  [ -x "$new_bin/$b" ] || { echo "compare_revisions: build this tree first ($new_bin/$b)" >&2; exit 2; }
done

echo "== building $base in $scratch"
if [ ! -d "$scratch/.git" ] && [ ! -f "$scratch/.git" ]; then
  git worktree add --detach "$scratch" "$base" >/dev/null
else
  git -C "$scratch" checkout -q --detach "$base"
fi
ln -sfn "$PWD/data" "$scratch/data"
cmake -S "$scratch" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" -j"${JOBS:-2}" --target train_step_bench ddp_scaling_bench >/dev/null
old_bin=$scratch/build/bench

# One figure per run: the median ms per step each bench prints in --json.
step_ms() {  # bench binary, args... -> "<row name>=<ms>" per JSON row
  "$@" --json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"): continue
    r = json.loads(line)
    name = r.get("config", "") + ("/" + r["setup"] if "setup" in r else "")
    ms = r.get("ms_per_step")
    if ms is not None: print(f"{name}={ms}")'
}

declare -A runs
run() {  # side, bench, args...
  local side=$1 bench=$2; shift 2
  local bin=$([ "$side" = base ] && echo "$old_bin" || echo "$new_bin")/$bench
  while IFS='=' read -r row ms; do
    runs["$bench $row $side"]+="$ms "
    printf '  %-6s %-18s %-28s %8.2f ms/step\n' "$side" "$bench" "$row" "$ms"
  done < <(step_ms "$bin" "$@")
}
for r in $(seq 1 "$rounds"); do
  echo "== round $r/$rounds (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  for side in base new; do run "$side" train_step_bench --only small --steps 30; done
  for side in base new; do run "$side" ddp_scaling_bench --quick --no-torch --no-share; done
done

echo
echo "median ms/step over $rounds rounds: base $base vs this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
printf '%-18s %-28s %10s %10s %12s\n' bench row base new new/base
for key in "${!runs[@]}"; do
  [[ $key == *" base" ]] || continue
  k=${key% base}
  python3 - "$k" "${runs[$key]}" "${runs[$k new]:-}" <<'PY'
import statistics, sys
k, base, new = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
bench, row = k.split(" ", 1)
b = statistics.median(map(float, base)); n = statistics.median(map(float, new)) if new else float("nan")
print(f"{bench:<18} {row:<28} {b:10.2f} {n:10.2f} {n / b:11.3f}x")
PY
done | sort
echo "(ratios above 1 are slower; single runs on a shared 2-core machine vary by several per cent)"
