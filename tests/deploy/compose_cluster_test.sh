#!/usr/bin/env bash
# The compose cluster for real: a Docker engine builds the CPU image from
# deploy/Dockerfile, deploy/docker-compose.yml brings the coordinator and its
# 4 CPU workers up under a project name of this run's own, the example job
# (examples/fortunes-ddp.yaml, fewer steps, a checkpoint every few) trains,
# one worker container is killed mid-run (SIGKILL) and started again. It
# requires:
#   - every container of the cluster healthy;
#   - the job RECOVERING after the kill, then SUCCEEDED;
#   - its per-step losses equal to the same job under `shardtrain local`
#     (run in a container of the same image) within 1e-6 relative;
#   - its committed checkpoints on the shared volume;
#   - /metrics of the coordinator and of every worker passing `promtool check
#     metrics`;
#   - deploy/prometheus.yml scraping every target `up`. The compose file
#     pins prom/prometheus, which no registry here serves: Debian's
#     prometheus binary (the test machine's) stands in, run inside the
#     cluster's network from the shardtrain image, with the compose file's
#     own prometheus.yml.
# Then, on the same image, the high-availability layer
# (deploy/docker-compose.ha.yml over the base file: 3 etcd members, 2
# coordinators) trains the same job while the leading coordinator's container
# is killed (SIGKILL) mid-run, and requires the other to lead (the failover's
# time is printed), the job to SUCCEED with the same losses as `shardtrain
# local`, and the killed one, started again, to stand by (/healthz 503). The
# pinned etcd image is replaced the same way: Debian's etcd and etcdctl
# (etcd-server, etcd-client) run in the shardtrain image with the file's
# command lines.
# Ports are not published: the test's compose file is deploy/docker-compose.yml
# without `ports` (written to a temporary directory), and every request runs
# inside the cluster's own network.
#
# Needs root and a Docker engine: when none runs, the test starts Debian's
# dockerd and stops it at the end. The engine's iptables rules stay (Docker
# leaves them: FORWARD policy DROP, bridged frames through iptables); tests
# that bridge namespaces of their own accept their bridge's frames
# (tests/integration/netns_test.cc). The base image deploy/Dockerfile names
# (DEBIAN_IMAGE) comes from no registry here: when it is missing it is made
# with `debootstrap --variant=minbase bookworm` and imported under that tag.
# Skips (exit 77, the reason on stdout) without root, docker, dockerd,
# docker-compose or debootstrap (scripts/setup installs them). Everything it
# started is removed on every exit — containers, the network, the volumes,
# the test's image tag (the builder's cached layers and the base image stay,
# so the next run builds incrementally) and the engine it started.
#
#   tests/deploy/compose_cluster_test.sh [STEPS]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
STEPS=${1:-60}
CKPT_EVERY=15
KILL_AFTER_STEP=25  # past the first committed checkpoint
T0=$(date +%s)

skip() { echo "SKIP: $*"; exit 77; }
say() { echo "[compose-test +$(($(date +%s) - T0))s] $*"; }

[ "$(id -u)" = 0 ] || skip "needs root to run a Docker engine"
# Debian's interpreter, which has PyYAML (a pyenv python3 first on PATH may not).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] && "$PY" -c "import yaml" 2>/dev/null || skip "python3 with PyYAML not found"
for tool in docker-compose promtool prometheus etcd etcdctl; do
  command -v "$tool" >/dev/null || skip "$tool not found (scripts/setup installs it)"
done
# Debian's docker CLI speaks to Debian's engine (another docker on PATH may
# need plugins this machine lacks).
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || true)
[ -n "$DOCKER" ] || skip "docker not found (scripts/setup installs docker.io)"

WORK=$(mktemp -d /tmp/shardtrain-compose-test.XXXXXX)
PROJECT="sttest$$"
TAG="compose-test-$$"
STARTED_DOCKERD=""
PROM=""
cleanup() {
  local rc=$?
  set +e
  # Prometheus first: its endpoint on the project's network would keep
  # `down` from removing the network (and then the volumes).
  [ -n "$PROM" ] && "$DOCKER" rm -f "$PROM" >/dev/null 2>&1
  if [ -n "${COMPOSE_FILE:-}" ] && [ -f "$COMPOSE_FILE" ]; then
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
      say "failed (exit $rc): the cluster's logs (last 30 lines per service)"
      compose logs --no-color --tail 30 2>&1 | tail -200
    fi
    compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1
  fi
  # Whatever `down` left of this project (a failed removal above).
  "$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT" | xargs -r "$DOCKER" rm -f \
    >/dev/null 2>&1
  "$DOCKER" volume ls -q --filter "name=^${PROJECT}_" | xargs -r "$DOCKER" volume rm >/dev/null 2>&1
  "$DOCKER" network ls -q --filter "name=^${PROJECT}_" | xargs -r "$DOCKER" network rm \
    >/dev/null 2>&1
  "$DOCKER" image rm --no-prune "shardtrain:$TAG" >/dev/null 2>&1
  if [ -n "$STARTED_DOCKERD" ]; then
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the engine
if ! "$DOCKER" info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || skip "no Docker engine runs and dockerd is not installed"
  say "starting dockerd"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 1 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.5; done
  if ! "$DOCKER" info >/dev/null 2>&1; then
    tail -5 "$WORK/dockerd.log"
    skip "dockerd did not start on this machine"
  fi
fi

# ---- the base image
BASE=$(sed -n 's/^ARG DEBIAN_IMAGE=//p' deploy/Dockerfile | head -1)
if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || skip "base image $BASE missing and debootstrap not found"
  say "making $BASE with debootstrap --variant=minbase bookworm"
  debootstrap --variant=minbase bookworm "$WORK/rootfs" http://deb.debian.org/debian \
    >"$WORK/debootstrap.log" 2>&1 || { tail -5 "$WORK/debootstrap.log"; exit 1; }
  tar -C "$WORK/rootfs" -c . | "$DOCKER" import - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

# ---- the image
REV=$(git rev-parse --short=10 HEAD 2>/dev/null || echo unknown)
say "building the cpu image shardtrain:$TAG (VCS_REF $REV)"
b0=$(date +%s)
DOCKER_BUILDKIT=1 "$DOCKER" build --network host -f deploy/Dockerfile --target cpu \
  -t "shardtrain:$TAG" --build-arg SHARDTRAIN_VERSION="$TAG" --build-arg VCS_REF="$REV" . \
  >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
say "image built in $(($(date +%s) - b0)) s"
version=$("$DOCKER" run --rm "shardtrain:$TAG" shardtrain --version)
say "image --version: $version"
case "$version" in *"git $REV"*) ;; *) echo "FAIL: --version does not name commit $REV"; exit 1 ;; esac

# ---- the cluster, without published ports
COMPOSE_FILE="$WORK/docker-compose.yml"
"$PY" - "$ROOT/deploy/docker-compose.yml" "$COMPOSE_FILE" <<'EOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
for service in doc["services"].values():
    service.pop("ports", None)
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
EOF
COMPOSE_FILES=(-f "$COMPOSE_FILE")
compose() {
  SHARDTRAIN_VERSION="$TAG" docker-compose --compatibility -p "$PROJECT" \
    --project-directory "$ROOT/deploy" "${COMPOSE_FILES[@]}" "$@"
}
say "compose up: coordinator, init-shared, worker x4 (project $PROJECT)"
compose up -d --no-build coordinator init-shared worker >"$WORK/up.log" 2>&1 ||
  { cat "$WORK/up.log"; exit 1; }
containers() { compose ps -q "$@"; }
COORD=$(containers coordinator)
mapfile -t WORKERS < <(containers worker)
[ "${#WORKERS[@]}" = 4 ] || { echo "FAIL: ${#WORKERS[@]} worker containers, want 4"; exit 1; }
health() { "$DOCKER" inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null || echo gone; }
name_of() { "$DOCKER" inspect -f '{{.Name}}' "$1" | sed 's|^/||'; }
# wait_healthy [CONTAINER...]: every one healthy within 90 s (default: the
# coordinator and the workers).
wait_healthy() {
  local deadline=$(($(date +%s) + 90)) c
  [ $# -gt 0 ] || set -- "$COORD" "${WORKERS[@]}"
  while :; do
    local bad=""
    for c in "$@"; do [ "$(health "$c")" = healthy ] || bad="$bad $(name_of "$c")"; done
    [ -z "$bad" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: not healthy:$bad"; return 1; }
    sleep 1
  done
}
wait_healthy
say "containers healthy: $(for c in "$COORD" "${WORKERS[@]}"; do
  printf '%s=%s ' "$("$DOCKER" inspect -f '{{.Name}}' "$c" | sed 's|^/||')" "$(health "$c")"; done)"

cli() { "$DOCKER" exec -e SHARDTRAIN_COORDINATOR=127.0.0.1:7070 "$COORD" shardtrain "$@"; }
SETS=(--set "steps=$STEPS" --set "checkpoint.every=$CKPT_EVERY" --set eval.every=0)
JOB=$("$DOCKER" exec "$COORD" sh -c "cd /opt/shardtrain && shardtrain submit \
  examples/fortunes-ddp.yaml --coordinator 127.0.0.1:7070 ${SETS[*]}" | tail -1)
say "submitted $JOB (${SETS[*]})"
field() { "$PY" -c "import json,sys; print(json.load(sys.stdin)$1)"; }
job_state() { cli status "$JOB" -o json | field "['state']"; }
job_step() { cli status "$JOB" -o json | field ".get('step', 0)"; }
# finish_job: waits (240 s at most) for $JOB to end, which must be SUCCEEDED;
# sets `restarts`.
finish_job() {
  local deadline=$(($(date +%s) + 240)) state
  while :; do
    state=$(job_state)
    case "$state" in SUCCEEDED|FAILED|CANCELLED) break ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: still $state after 240 s"; exit 1; }
    sleep 1
  done
  restarts=$(cli status "$JOB" -o json | field ".get('restarts', 0)")
  say "job $JOB: $state, restarts $restarts"
  [ "$state" = SUCCEEDED ] || { cli status "$JOB"; exit 1; }
}

# ---- kill one worker container mid-run, start it again
deadline=$(($(date +%s) + 120))
until [ "$(job_step)" -ge "$KILL_AFTER_STEP" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: no step $KILL_AFTER_STEP in 120 s"; exit 1; }
  state=$(job_state)
  case "$state" in FAILED|CANCELLED|SUCCEEDED) echo "FAIL: $state before the kill"; exit 1 ;; esac
  sleep 0.3
done
VICTIM=${WORKERS[1]}
say "step $(job_step): docker kill $("$DOCKER" inspect -f '{{.Name}}' "$VICTIM")"
"$DOCKER" kill "$VICTIM" >/dev/null
saw_recovering=""
deadline=$(($(date +%s) + 120))
while :; do
  state=$(job_state)
  [ "$state" = RECOVERING ] && saw_recovering=yes
  [ -n "$saw_recovering" ] && break
  case "$state" in FAILED|CANCELLED|SUCCEEDED) break ;; esac
  [ "$(date +%s)" -lt "$deadline" ] || break
  sleep 0.2
done
say "after the kill: $state"
[ -n "$saw_recovering" ] || { echo "FAIL: the job never showed RECOVERING (last $state)"; exit 1; }
"$DOCKER" start "$VICTIM" >/dev/null
say "worker started again"
finish_job
[ "$restarts" -ge 1 ] || { echo "FAIL: no restart recorded"; exit 1; }
wait_healthy

# ---- the same job under `shardtrain local`, in a container of the image
cli history "$JOB" -o json >"$WORK/cluster.json"
"$DOCKER" run --rm -w /tmp -e HOME=/tmp "shardtrain:$TAG" sh -c "cp -r /opt/shardtrain/data \
  /opt/shardtrain/examples . && shardtrain local examples/fortunes-ddp.yaml --workers 4 \
  ${SETS[*]} --set checkpoint.every=0 -o json" >"$WORK/local.json" 2>"$WORK/local.log" ||
  { tail -20 "$WORK/local.log"; exit 1; }
"$PY" tests/deploy/compare_losses.py "$WORK/cluster.json" "$WORK/local.json" "$STEPS" \
  "the compose cluster" || exit 1

# ---- checkpoints on the shared volume
ckpts=$("$DOCKER" exec "${WORKERS[0]}" sh -c 'ls -d /srv/shardtrain/ckpt/fortunes-ddp/step-* \
  /srv/shardtrain/ckpt/fortunes-ddp/final.weights 2>/dev/null' | xargs -n1 basename | tr '\n' ' ')
say "checkpoints on the shared volume: $ckpts"
case "$ckpts" in *step-*) ;; *) echo "FAIL: no committed checkpoint step"; exit 1 ;; esac
case "$ckpts" in *final.weights*) ;; *) echo "FAIL: no final weights"; exit 1 ;; esac
cli checkpoints "$JOB"

# ---- /metrics through promtool
for c in "$COORD" "${WORKERS[@]}"; do
  port=9091
  [ "$c" = "$COORD" ] && port=9090
  name=$("$DOCKER" inspect -f '{{.Name}}' "$c" | sed 's|^/||')
  "$DOCKER" exec "$c" curl -fsS "http://127.0.0.1:$port/metrics" >"$WORK/metrics"
  promtool check metrics <"$WORK/metrics" || { echo "FAIL: $name's /metrics"; exit 1; }
  say "promtool check metrics: $name OK ($(grep -c '^shardtrain_' "$WORK/metrics") samples)"
done

# ---- Prometheus with the compose file's prometheus.yml
PROM=$("$DOCKER" run -d --network "${PROJECT}_default" \
  -v "$(command -v prometheus):/usr/local/bin/prometheus:ro" \
  -v "$ROOT/deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" \
  "shardtrain:$TAG" prometheus --config.file=/etc/prometheus/prometheus.yml \
  --storage.tsdb.path=/tmp/prometheus --web.listen-address=127.0.0.1:9090)
deadline=$(($(date +%s) + 60))
while :; do
  "$DOCKER" exec "$PROM" curl -fsS http://127.0.0.1:9090/api/v1/targets >"$WORK/targets.json" \
    2>/dev/null || true
  if "$PY" - "$WORK/targets.json" <<'EOF'; then break; fi
import json, sys
try:
    targets = json.load(open(sys.argv[1]))["data"]["activeTargets"]
except Exception:
    sys.exit(1)
up = [t for t in targets if t["health"] == "up"]
for t in targets:
    print(f"  {t['labels']['job']:24s} {t['scrapeUrl']:40s} {t['health']}")
sys.exit(0 if len(targets) == 5 and len(up) == 5 else 1)
EOF
  [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: Prometheus targets not all up"; exit 1; }
  sleep 2
done
say "Prometheus: every target up (1 coordinator + 4 workers)"
"$DOCKER" rm -f "$PROM" >/dev/null && PROM=""

# ---- high availability: deploy/docker-compose.ha.yml over the base file
# (3 etcd members, 2 coordinators on them). The leader's container is killed
# mid-run: the standby takes over, the workers train through it, and the job
# ends as the uninterrupted `shardtrain local` run above. etcd's pinned image
# comes from no registry here: Debian's etcd and etcdctl (this machine's, as
# Prometheus above) run in the shardtrain image with the file's commands.
say "phase 2, high availability: compose down, then the HA layer"
compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1
HA_FILE="$WORK/docker-compose.ha.yml"
"$PY" - "$ROOT/deploy/docker-compose.ha.yml" "$HA_FILE" "$(command -v etcd)" \
  "$(command -v etcdctl)" <<'EOF2'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
for name, service in doc["services"].items():
    service.pop("ports", None)
    if service.get("image", "").startswith("gcr.io/etcd-development/etcd:"):
        service["image"] = "shardtrain:${SHARDTRAIN_VERSION}"
        service["user"] = "0:0"  # the member's data volume, as etcd's own image runs
        service["volumes"] = service.get("volumes", []) + [
            f"{sys.argv[3]}:/usr/local/bin/etcd:ro", f"{sys.argv[4]}:/usr/local/bin/etcdctl:ro"]
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
EOF2
COMPOSE_FILES=(-f "$COMPOSE_FILE" -f "$HA_FILE")
compose up -d --no-build etcd-1 etcd-2 etcd-3 coordinator coordinator-2 init-shared worker \
  >"$WORK/up-ha.log" 2>&1 || { cat "$WORK/up-ha.log"; exit 1; }
mapfile -t ETCD < <(containers etcd-1 etcd-2 etcd-3)
COORDS=("$(containers coordinator)" "$(containers coordinator-2)")
mapfile -t WORKERS < <(containers worker)
wait_healthy "${ETCD[@]}" "${COORDS[@]}" "${WORKERS[@]}"
healthz() {  # the HTTP status of a coordinator's /healthz: 200 leads, 503 stands by
  "$DOCKER" exec "$1" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9090/healthz \
    2>/dev/null || echo down
}
leader() {  # the coordinators whose /healthz is 200, one a line
  local c
  for c in "${COORDS[@]}"; do if [ "$(healthz "$c")" = 200 ]; then echo "$c"; fi; done
}
deadline=$(($(date +%s) + 60))
until [ "$(leader | wc -l)" = 1 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: no single leader in 60 s"; exit 1; }
  sleep 0.5
done
LEADER=$(leader)
say "healthy: 3 etcd members, 2 coordinators (leader $(name_of "$LEADER"), the other \
/healthz $(healthz "$(for c in "${COORDS[@]}"; do [ "$c" != "$LEADER" ] && echo "$c"; done)")), 4 workers"
BOTH=coordinator:7070,coordinator-2:7070
cli() { "$DOCKER" exec -e SHARDTRAIN_COORDINATOR="$BOTH" "${WORKERS[0]}" shardtrain "$@"; }
JOB=$("$DOCKER" exec "${WORKERS[0]}" sh -c "cd /opt/shardtrain && shardtrain submit \
  examples/fortunes-ddp.yaml --coordinator $BOTH ${SETS[*]}" | tail -1)
say "submitted $JOB through $BOTH"
deadline=$(($(date +%s) + 120))
until [ "$(job_step)" -ge "$KILL_AFTER_STEP" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: no step $KILL_AFTER_STEP in 120 s"; exit 1; }
  sleep 0.3
done
say "step $(job_step): docker kill $(name_of "$LEADER") (the leader)"
k0=$(date +%s%N)
"$DOCKER" kill "$LEADER" >/dev/null
deadline=$(($(date +%s) + 60))
until [ -n "$(leader)" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "FAIL: no new leader 60 s after the kill"; exit 1; }
  sleep 0.2
done
NEW=$(leader)
say "failover: $(name_of "$NEW") leads $(( ($(date +%s%N) - k0) / 1000000 )) ms after the kill \
(--leader-ttl-s 5)"
"$DOCKER" start "$LEADER" >/dev/null
finish_job
wait_healthy "${COORDS[@]}"
[ "$(healthz "$LEADER")" = 503 ] || { echo "FAIL: the old leader, back, is not a standby \
(/healthz $(healthz "$LEADER"))"; exit 1; }
say "$(name_of "$LEADER") is back as the standby (/livez healthy, /healthz 503)"
cli history "$JOB" -o json >"$WORK/cluster-ha.json"
"$PY" tests/deploy/compare_losses.py "$WORK/cluster-ha.json" "$WORK/local.json" "$STEPS" \
  "the HA compose cluster" || exit 1
cli checkpoints "$JOB"
say "PASS in $(($(date +%s) - T0)) s (teardown follows: containers, network, volumes, image tag)"
