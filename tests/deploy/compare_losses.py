#!/usr/bin/python3
"""Per-step losses of a cluster's run against `shardtrain local`'s.

Usage: compare_losses.py RUN.json LOCAL.json STEPS NAME [TOLERANCE]

RUN.json and LOCAL.json are `shardtrain history -o json` or `shardtrain local
-o json` outputs (a {"steps": [...]} object, or the list itself). Every step
1..STEPS must have a loss in both, within TOLERANCE relative (default 1e-6);
prints one line with the first and last losses and the largest difference,
and exits 1 (with "FAIL: ...") otherwise. Used by the deployment tests
(compose_cluster_test.sh, slurm_cluster_test.sh).
"""
import json
import sys


def losses(path):
    doc = json.load(open(path))
    steps = doc["steps"] if isinstance(doc, dict) else doc
    return {int(s["step"]): float(s["loss"]) for s in steps}


def main():
    run, local = losses(sys.argv[1]), losses(sys.argv[2])
    steps, name = int(sys.argv[3]), sys.argv[4]
    tolerance = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-6
    missing = [s for s in range(1, steps + 1) if s not in run or s not in local]
    if missing:
        sys.exit(f"FAIL: {name}: steps without a loss: {missing[:10]}")
    worst = max(abs(run[s] - local[s]) / abs(local[s]) for s in range(1, steps + 1))
    print(f"losses of {name}: step 1 {run[1]:.6f} (local {local[1]:.6f}), step {steps} "
          f"{run[steps]:.6f} (local {local[steps]:.6f}); max rel diff over {steps} steps "
          f"{worst:.3g}")
    if worst > tolerance:
        sys.exit(f"FAIL: {name}: the losses differ from shardtrain local's")


if __name__ == "__main__":
    main()
