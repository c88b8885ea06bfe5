#!/usr/bin/env bash
# A Slurm cluster for real, on this machine: munged, slurmctld and 4 slurmd
# nodes (`slurmd -N nK`, each its own port on 127.0.0.1) with a generated
# munge key and slurm.conf in a temporary directory. On it,
# deploy/slurm/shardtrain.sbatch trains examples/fortunes-ddp.yaml (dp 4, one
# CPU worker per node; fewer steps, a checkpoint every few) three times:
#   1. as it is: the batch job exits 0 (SUCCEEDED) and its per-step losses
#      equal `shardtrain local` of the same spec (4 workers) within 1e-6;
#   2. with one node's worker killed (SIGKILL) mid-run: the launcher starts
#      it again, the job recovers from its last committed checkpoint and
#      SUCCEEDS with the uninterrupted curve;
#   3. with `scontrol requeue` of the whole allocation mid-run: the requeued
#      allocation's coordinator restarts on the same state directory and the
#      job resumes from its last committed checkpoint: SUCCEEDED, the same
#      curve, no second submit.
#   4. scancel of a running allocation: no process of it is left.
# Then every daemon it started is stopped and no process of it is left.
# Skips (exit 77, the reason on stdout) without root, slurm-wlm or munge
# (scripts/setup --only slurm installs them) or the built programs.
#
#   tests/deploy/slurm_cluster_test.sh BIN_DIR [STEPS]   (default 40)
# SHARDTRAIN_TEST_KEEP=1 keeps its directory (logs, state) for a look.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" 2>/dev/null && pwd) || BIN=${1:-$ROOT/build/bin}
STEPS=${2:-40}
CKPT_EVERY=10
T0=$(date +%s)
skip() { echo "SKIP: $*"; exit 77; }
say() { echo "[slurm-test +$(($(date +%s) - T0))s] $*"; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to run munged, slurmctld and slurmd"
for tool in munged slurmctld slurmd sbatch scontrol squeue; do
  command -v "$tool" >/dev/null || skip "$tool not found (scripts/setup --only slurm installs it)"
done
for p in shardtrain shardtrain-coordinator shardtrain-worker; do
  [ -x "$BIN/$p" ] || skip "no $BIN/$p (build first)"
done
[ -f "$ROOT/data/fortunes.txt" ] || fail "data/fortunes.txt is missing: run scripts/setup"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

WORK=$(mktemp -d /tmp/shardtrain-slurm-test.XXXXXX)
chmod 755 "$WORK"
DAEMONS=()
cleanup() {
  local rc=$?
  if [ $rc != 0 ]; then  # what the logs say, for the CI log
    for f in "$WORK"/*.out "$WORK"/*.state/coordinator.log "$WORK/log/slurmctld.log"; do
      [ -f "$f" ] || continue
      echo "--- $f (end)"
      grep -v '^step ' "$f" | tail -n 15
    done
  fi
  export SLURM_CONF=$WORK/slurm.conf
  scancel --full $(squeue -h -o %i 2>/dev/null) >/dev/null 2>&1
  for pid in "${DAEMONS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 1
  pkill -9 -f "$WORK" 2>/dev/null  # anything of this run still alive
  for pid in "${DAEMONS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  sleep 0.5
  local left
  left=$(pgrep -af "$WORK" | grep -v pgrep)
  [ -n "$left" ] && { echo "FAIL: processes left after teardown:"; echo "$left"; rc=1; }
  if [ -n "${SHARDTRAIN_TEST_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
  exit $rc
}
trap cleanup EXIT

# Five free ports: slurmctld's and one per slurmd.
read -r -a PORTS < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)
mkdir -p "$WORK/munge" "$WORK/state" "$WORK/log" "$WORK/submit"
for n in 1 2 3 4; do mkdir -p "$WORK/spool/n$n"; done
head -c 1024 /dev/urandom >"$WORK/munge/key"
chmod 600 "$WORK/munge/key"
munged -f --key-file="$WORK/munge/key" --socket="$WORK/munge/sock" --pid-file="$WORK/munge/pid" \
  --log-file="$WORK/munge/log" --seed-file="$WORK/munge/seed" || fail "munged did not start"
for _ in $(seq 1 50); do [ -s "$WORK/munge/pid" ] && break; sleep 0.1; done
DAEMONS+=("$(cat "$WORK/munge/pid")")
cat >"$WORK/slurm.conf" <<EOF
ClusterName=shardtrain-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=${PORTS[0]}
AuthType=auth/munge
AuthInfo=socket=$WORK/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[1]} CPUs=2
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[2]} CPUs=2
NodeName=n3 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[3]} CPUs=2
NodeName=n4 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[4]} CPUs=2
PartitionName=test Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$WORK/slurm.conf
slurmctld -f "$SLURM_CONF" -i || fail "slurmctld did not start"
for _ in $(seq 1 50); do [ -s "$WORK/slurmctld.pid" ] && break; sleep 0.1; done
DAEMONS+=("$(cat "$WORK/slurmctld.pid")")
for n in 1 2 3 4; do
  slurmd -f "$SLURM_CONF" -N "n$n" || fail "slurmd n$n did not start"
  for _ in $(seq 1 50); do [ -s "$WORK/slurmd-n$n.pid" ] && break; sleep 0.1; done
  DAEMONS+=("$(cat "$WORK/slurmd-n$n.pid")")
done
for _ in $(seq 1 100); do
  [ "$(sinfo -h -o '%T %D' | awk '$1 == "idle" {print $2}')" = 4 ] && break
  sleep 0.2
done
sinfo
[ "$(sinfo -h -o '%T %D' | awk '$1 == "idle" {print $2}')" = 4 ] || fail "the 4 nodes are not idle"
srun -N4 bash -c 'echo "  node $SLURM_NODEID: $SLURMD_NODENAME"' | sort
say "nodes up: munged, slurmctld and 4 slurmd ($(sinfo -h -o %N))"

SETS=(--set "steps=$STEPS" --set "checkpoint.every=$CKPT_EVERY" --set eval.every=0
      --set "data.train=$ROOT/data/fortunes.txt" --set "data.val=$ROOT/data/fortunes-val.txt")
export SHARDTRAIN_BIN=$BIN SHARDTRAIN_WORKER_ARGS="--threads 1"
SPEC=$ROOT/examples/fortunes-ddp.yaml

# sbatch of the launcher for run NAME, in the background; its batch job id.
submit() {
  local name=$1
  sbatch --parsable -N 4 --chdir "$WORK/submit" -o "$WORK/$name.out" --job-name "$name" \
    --export=ALL,SHARDTRAIN_STATE="$WORK/$name.state" \
    "$ROOT/deploy/slurm/shardtrain.sbatch" "$SPEC" "${SETS[@]}" \
    --set "checkpoint.dir=$WORK/ckpt-$name"
}
# The batch job's state and exit code (scontrol keeps ended jobs a while).
slurm_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
slurm_exit() { scontrol show job "$1" 2>/dev/null | sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p'; }
wait_done() {  # JOB TIMEOUT_S: waits until the batch job ended
  local deadline=$(($(date +%s) + $2)) st
  while :; do
    st=$(slurm_state "$1")
    case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || { echo "batch job $1 still $st after $2 s"; return 1; }
    sleep 0.5
  done
}
# The shardtrain CLI against run NAME's coordinator (from its state dir).
st_cli() {
  local name=$1 command=$2
  shift 2
  local state=$WORK/$name.state
  SHARDTRAIN_COORDINATOR=127.0.0.1:$(head -1 "$state/port" 2>/dev/null) \
    SHARDTRAIN_TOKEN=$(cat "$state/user.token" 2>/dev/null) \
    "$BIN/shardtrain" "$command" --tls-ca "$state/tls.pem" --timeout-ms 2000 "$@"
}
job_field() {  # NAME FIELD: a field of the training job's status
  local job
  job=$(cat "$WORK/$1.state/job_id" 2>/dev/null) || return 1
  st_cli "$1" status "$job" -o json 2>/dev/null | "$PY" -c "import json,sys; print(json.load(sys.stdin).get('$2', 0))" 2>/dev/null
}
wait_step() {  # NAME STEP: waits until the training job is past STEP
  local deadline=$(($(date +%s) + 180)) s
  while :; do
    s=$(job_field "$1" step)
    [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || { echo "run $1: no step $2 in 180 s (at ${s:-?})"; return 1; }
    sleep 0.3
  done
}
# Run NAME's per-step losses against the local reference.
compare() {
  "$PY" "$ROOT/tests/deploy/compare_losses.py" "$WORK/$1.state/history.json" "$WORK/local.json" \
    "$STEPS" "$1"
}
# The batch job NAME ended with exit 0 and the training job SUCCEEDED.
expect_succeeded() {
  local name=$1 id=$2 code
  code=$(slurm_exit "$id")
  tail -n 4 "$WORK/$name.out" | sed 's/^/  | /'
  [ "$code" = 0 ] || { tail -n 30 "$WORK/$name.out"; fail "run $name: batch job exit $code"; }
  grep -q 'SUCCEEDED' "$WORK/$name.out" || fail "run $name: no SUCCEEDED in its log"
}

# ---- the reference: the same spec under `shardtrain local`, 4 workers
(cd "$WORK/submit" && "$BIN/shardtrain" local "$SPEC" --workers 4 --threads 1 "${SETS[@]}" \
  --set "checkpoint.dir=$WORK/ckpt-local" -o json >"$WORK/local.json" 2>"$WORK/local.log") ||
  { tail -20 "$WORK/local.log"; fail "shardtrain local failed"; }
say "reference: shardtrain local, $STEPS steps"

# ---- 1. as it is
id=$(submit plain) || fail "sbatch failed"
say "run 1: batch job $id (sbatch -N 4 deploy/slurm/shardtrain.sbatch examples/fortunes-ddp.yaml)"
wait_done "$id" 300 || fail "run 1 did not end"
expect_succeeded plain "$id"
compare plain || exit 1
say "run 1: SUCCEEDED, losses equal"

# ---- 2. a worker killed mid-run
id=$(submit kill) || fail "sbatch failed"
wait_step kill $((CKPT_EVERY + 5)) || fail "run 2 did not reach step $((CKPT_EVERY + 5))"
victim=$(pgrep -f "shardtrain-worker.*$WORK/kill.state" | head -1)
[ -n "$victim" ] || fail "run 2: no worker process found"
at=$(job_field kill step)
kill -9 "$victim"
say "run 2: batch job $id, kill -9 of worker $victim at step $at"
wait_done "$id" 300 || fail "run 2 did not end"
expect_succeeded kill "$id"
grep -q 'RECOVER' "$WORK/kill.out" || fail "run 2: the job never recovered"
grep -q 'starting it again' "$WORK/kill.state/"worker-*.log || fail "run 2: the worker was not restarted"
compare kill || exit 1
say "run 2: recovered from the step-$CKPT_EVERY checkpoint, SUCCEEDED, losses equal"

# ---- 3. the whole allocation requeued mid-run
id=$(submit requeue) || fail "sbatch failed"
wait_step requeue $((CKPT_EVERY + 5)) || fail "run 3 did not reach step $((CKPT_EVERY + 5))"
at=$(job_field requeue step)
job_before=$(cat "$WORK/requeue.state/job_id")
scontrol requeue "$id" || fail "scontrol requeue $id failed"
say "run 3: batch job $id requeued at step $at (training job $job_before)"
# Slurm holds a requeued job back for a while (its BeginTime moves ~2 min
# ahead, once the old run has ended); an operator who wants it now says so,
# again until it runs. Then the second run of the batch script starts, whose
# end is waited for (the first run's end must not be taken for it).
for _ in $(seq 1 120); do
  grep -q '(restart 1)' "$WORK/requeue.out" && break
  [ "$(slurm_state "$id")" = PENDING ] && scontrol update JobId="$id" StartTime=now 2>/dev/null
  sleep 1
done
grep -q '(restart 1)' "$WORK/requeue.out" || fail "run 3: the requeued batch job did not start again"
wait_done "$id" 300 || fail "run 3 did not end"
expect_succeeded requeue "$id"
restarts=$(scontrol show job "$id" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
[ "${restarts:-0}" -ge 1 ] || fail "run 3: Slurm shows no restart of the batch job"
grep -q "resuming job $job_before" "$WORK/requeue.out" || fail "run 3: the requeued run did not resume $job_before"
[ "$(grep -c 'submitted ' "$WORK/requeue.out")" = 1 ] || fail "run 3: submitted more than once"
compare requeue || exit 1
say "run 3: requeued (Slurm restarts $restarts), resumed job $job_before, SUCCEEDED, losses equal"

# ---- 4. scancel stops everything the launcher started
id=$(submit cancel) || fail "sbatch failed"
wait_step cancel 3 || fail "run 4 did not reach step 3"
running=$(pgrep -fc "shardtrain-.*$WORK/cancel.state")
scancel "$id"
for _ in $(seq 1 100); do
  pgrep -f "shardtrain-.*$WORK/cancel.state" >/dev/null || break
  sleep 0.2
done
left=$(pgrep -fa "shardtrain-.*$WORK/cancel.state")
[ -z "$left" ] || fail "run 4: still running after scancel: $left"
say "run 4: scancel of batch job $id stopped its $running shardtrain processes"

# ---- teardown: every daemon and process of this run stops
for _ in $(seq 1 150); do squeue -h | grep -q . || break; sleep 0.2; done
squeue -h | grep -q . && fail "jobs still queued: $(squeue -h)"
say "teardown: stopping munged, slurmctld, 4 slurmd"
exit 0
