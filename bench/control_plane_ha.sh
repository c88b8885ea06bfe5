#!/usr/bin/env bash
# The control plane on SQLite and on etcd, one after the other on this
# machine (issue 50): the real coordinator process under 10,000 simulated
# workers each time (register, heartbeat, submit latencies as ratios to an
# empty RPC measured in the same run), then on etcd 20 kills (-9) of the
# leader with a standby beside it, timed kill -> the standby serving.
#   bench/control_plane_ha.sh [BUILD_DIR] [extra control_plane_bench flags]
set -euo pipefail
build=${1:-build}
shift || true
bench="$build/bench/control_plane_bench"
common=(--process --workers 10000 --seconds 5 --jobs 200 --modes paced "$@")
echo "== SQLite (--state-dir)"
"$bench" "${common[@]}" --state sqlite
echo
echo "== etcd (one member on loopback), then 20 leader failovers"
"$bench" "${common[@]}" --state etcd --failovers 20 --leader-ttl-s 2
