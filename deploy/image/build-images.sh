#!/usr/bin/env bash
# Builds every image the compose stack uses, without a container registry:
#   localhost/llmfleet-base:bookworm       debootstrap'ed Debian bookworm (build-base.sh)
#   localhost/llmfleet:latest              the project: every llmfleet process, etcd, OTLP stand-in
#   localhost/llmfleet-prometheus:latest   Debian's prometheus package on the same base
# The project image installs from deploy/image/wheels (wheelhouse.sh: the host venv's versions),
# offline. Idempotent: an image that exists is kept unless FORCE=1, or the project image is older
# than a file it is built from (libs/ services/ deploy/compose/ deploy/local/ pyproject.toml; tests
# are not in the image and do not count).
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_IMAGE=${BASE_IMAGE:-localhost/llmfleet-base:bookworm}
IMAGE=${IMAGE:-localhost/llmfleet:latest}
PROM_IMAGE=${PROM_IMAGE:-localhost/llmfleet-prometheus:latest}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
log_dir=${LOG_DIR:-/tmp/llmfleet-image-build}
mkdir -p "$log_dir"

timed() {  # timed NAME CMD...: run quietly, print the duration, show the log tail on failure
  local name=$1 start; start=$(date +%s); shift
  if ! "$@" >"$log_dir/$name.log" 2>&1; then
    tail -30 "$log_dir/$name.log" >&2
    echo "build-images: $name FAILED (log: $log_dir/$name.log)" >&2
    return 1
  fi
  echo "build-images: $name built in $(( $(date +%s) - start ))s"
}

image_created() { podman image inspect --format '{{.Created.Unix}}' "$1" 2>/dev/null || echo 0; }

deploy/image/build-base.sh

stale=0
if [[ ${FORCE:-0} == 1 ]] || ! podman image exists "$IMAGE"; then
  stale=1
else
  created=$(image_created "$IMAGE")
  newest=$(find libs services deploy/compose deploy/local pyproject.toml -type f \
    -not -path '*/__pycache__/*' -not -path 'libs/tests/*' -not -path 'services/*/tests/*' -newermt "@$created" -print -quit)
  [[ -n $newest ]] && { echo "build-images: $IMAGE is older than $newest"; stale=1; }
fi
if ((stale)); then
  deploy/image/wheelhouse.sh
  old=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  timed project podman build --runtime runc \
    --ignorefile deploy/compose/Dockerfile.dockerignore \
    --build-arg BASE="$BASE_IMAGE" --build-arg PIP_OFFLINE=1 --build-arg TORCH_VERSION="$TORCH_VERSION" \
    -f deploy/compose/Dockerfile -t "$IMAGE" .
  # the previous build, now untagged (its layers shared with the new one stay)
  [[ -n $old && $old != $(podman image inspect --format '{{.Id}}' "$IMAGE") ]] && podman rmi "$old" >/dev/null 2>&1 || true
else
  echo "build-images: $IMAGE is up to date (FORCE=1 rebuilds)"
fi

if [[ ${FORCE:-0} == 1 ]] || ! podman image exists "$PROM_IMAGE" || [[ -n $(find deploy/compose/Dockerfile.prometheus \
    deploy/compose/prometheus.yml -newermt "@$(image_created "$PROM_IMAGE")" -print -quit) ]]; then
  old=$(podman image inspect --format '{{.Id}}' "$PROM_IMAGE" 2>/dev/null || true)
  timed prometheus podman build --runtime runc --build-arg BASE="$BASE_IMAGE" \
    -f deploy/compose/Dockerfile.prometheus -t "$PROM_IMAGE" deploy/compose
  [[ -n $old && $old != $(podman image inspect --format '{{.Id}}' "$PROM_IMAGE") ]] && podman rmi "$old" >/dev/null 2>&1 || true
else
  echo "build-images: $PROM_IMAGE is up to date (FORCE=1 rebuilds)"
fi
