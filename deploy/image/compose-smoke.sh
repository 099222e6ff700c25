#!/usr/bin/env bash
# End-to-end smoke test of the compose stack with podman, no container registry needed:
#   1. podman setup (setup-podman.sh) and the images (build-images.sh), both skipped when present;
#   2. podman-compose up: etcd, scheduler, profiler, placement, migration, engine-0/1, OTLP receiver,
#      Prometheus (project "llmfleet-smoke");
#   3. waits until the scheduler routes every service to an engine that loaded its model;
#   4. ONE OpenAI completion (openai package, http://127.0.0.1:8000/v1, model "chat") and ONE SDK
#      completion (llmfleet.client.Client, service "summarize");
#   5. /metrics of the scheduler and both engines (llmfleet_ and vllm: names, request counters),
#      Prometheus targets + a query, spans at the OTLP receiver;
#   6. tears the stack down (always, trap), volumes and network included.
# Exit status: non-zero on any failure (the containers' last log lines are printed first).
# Env: SMOKE_PROJECT, SMOKE_TIMEOUT_S (health wait, default 240), KEEP=1 (leave the stack up),
#      LLMFLEET_{HTTP,GRPC,PROMETHEUS,SCHEDULER_METRICS,ENGINE0_METRICS,ENGINE1_METRICS}_PORT.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
COMPOSE_FILE=deploy/compose/docker-compose.yml
export SMOKE_PROJECT=${SMOKE_PROJECT:-llmfleet-smoke}
export LLMFLEET_IMAGE=${LLMFLEET_IMAGE:-localhost/llmfleet:latest}
export LLMFLEET_PROMETHEUS_IMAGE=${LLMFLEET_PROMETHEUS_IMAGE:-localhost/llmfleet-prometheus:latest}
TIMEOUT_S=${SMOKE_TIMEOUT_S:-240}
t0=$(date +%s)
phase_t=$t0
phase() {  # phase NAME: print the time the previous phase took, start a new one
  local now; now=$(date +%s)
  [[ -n ${PHASE:-} ]] && timings+=("$PHASE $((now - phase_t))s")
  PHASE=$1 phase_t=$now
  echo "== $1"
}
timings=()
compose() { podman-compose -p "$SMOKE_PROJECT" -f "$COMPOSE_FILE" "$@"; }

phase "setup (podman, images)"
"$PY" -c "import openai, llmfleet.client" 2>/dev/null || { echo "compose-smoke: $PY lacks openai/llmfleet (run make setup)" >&2; exit 1; }
deploy/image/setup-podman.sh
deploy/image/build-images.sh

# Host ports: the defaults (8000, 50051, ...) unless set; a default that is taken (e.g. by a local
# `llmfleet up` or tests) is replaced by a free port, said on the output. A port set explicitly must be free.
port_free() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', $1))" 2>/dev/null; }
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
for var in LLMFLEET_HTTP_PORT:8000 LLMFLEET_GRPC_PORT:50051 LLMFLEET_PROMETHEUS_PORT:9090 \
           LLMFLEET_SCHEDULER_METRICS_PORT:51051 LLMFLEET_ENGINE0_METRICS_PORT:51061 LLMFLEET_ENGINE1_METRICS_PORT:51062; do
  name=${var%%:*} def=${var##*:}
  if [[ -n ${!name:-} ]]; then
    port_free "${!name}" || { echo "compose-smoke: host port ${!name} ($name) is in use" >&2; exit 1; }
  elif port_free "$def"; then
    export "$name=$def"
  else
    export "$name=$(free_port)"
    echo "  host port $def is taken: $name=${!name}"
  fi
done

teardown() {
  rc=$?
  trap - EXIT INT TERM
  if ((rc != 0)); then
    echo "== FAILED (exit $rc); last log lines of each container:" >&2
    for c in $(podman ps -a --filter "label=io.podman.compose.project=$SMOKE_PROJECT" --format '{{.Names}}' 2>/dev/null); do
      echo "-- $c ($(podman inspect --format '{{.State.Status}} exit={{.State.ExitCode}} restarts={{.RestartCount}}' "$c" 2>/dev/null))" >&2
      podman logs --tail 15 "$c" 2>&1 | sed 's/^/   /' >&2 || true
    done
  fi
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "== KEEP=1: stack left up (podman-compose -p $SMOKE_PROJECT -f $COMPOSE_FILE down -v)"
  else
    echo "== teardown"
    compose down -v -t 5 >"$LOGDIR/down.log" 2>&1 || { echo "compose-smoke: down failed (see $LOGDIR/down.log)" >&2; rc=1; }
    podman network rm "${SMOKE_PROJECT}_default" >/dev/null 2>&1 || true
    left=$(podman ps -a --filter "label=io.podman.compose.project=$SMOKE_PROJECT" -q | wc -l)
    ((left == 0)) || { echo "compose-smoke: $left containers left behind" >&2; rc=1; }
  fi
  echo "== $( ((rc == 0)) && echo PASSED || echo FAILED ) in $(( $(date +%s) - t0 ))s: ${timings[*]}${PHASE:+ $PHASE $(( $(date +%s) - phase_t ))s}"
  exit "$rc"
}
LOGDIR=$(mktemp -d /tmp/llmfleet-compose-smoke.XXXXXX)
trap teardown EXIT
trap 'exit 130' INT TERM

phase "compose up (project $SMOKE_PROJECT)"
compose down -v -t 5 >"$LOGDIR/predown.log" 2>&1 || true   # leftovers of an interrupted run
if ! compose up -d --no-build >"$LOGDIR/up.log" 2>&1; then
  tail -20 "$LOGDIR/up.log" >&2; exit 1
fi
grep -q "exit code: [^0]" "$LOGDIR/up.log" && { grep -B3 "exit code: [^0]" "$LOGDIR/up.log" | tail -20 >&2; exit 1; }
podman ps --filter "label=io.podman.compose.project=$SMOKE_PROJECT" --format '  {{.Names}}\t{{.Status}}\t{{.Ports}}'

phase "wait for health"
"$PY" deploy/image/smoke_checks.py wait --timeout-s "$TIMEOUT_S"

phase "requests"
"$PY" deploy/image/smoke_checks.py requests

phase "metrics, Prometheus, traces"
"$PY" deploy/image/smoke_checks.py metrics --timeout-s 60

restarts=$(podman ps -a --filter "label=io.podman.compose.project=$SMOKE_PROJECT" --format '{{.Names}}' |
  xargs -r podman inspect --format '{{.Name}}={{.RestartCount}}' | grep -v '=0$' || true)
[[ -z $restarts ]] || { echo "compose-smoke: containers restarted: $restarts" >&2; exit 1; }
echo "  no container restarted"
