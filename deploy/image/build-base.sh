#!/usr/bin/env bash
# Builds the base image localhost/llmfleet-base:bookworm WITHOUT a container registry:
# debootstrap a minimal Debian bookworm (python3.11, venv, pip, ca-certificates) from the Debian
# mirror and import the directory as an image. The project image then builds with
#   --build-arg BASE=localhost/llmfleet-base:bookworm
# Idempotent: does nothing when the image exists (FORCE=1 rebuilds).
# Env: MIRROR (default: the host's deb.debian.org mirror), IMAGE, ROOTFS (scratch dir).
set -euo pipefail

IMAGE=${IMAGE:-localhost/llmfleet-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOTFS=${ROOTFS:-/var/tmp/llmfleet-base-rootfs}
PKGS=python3,python3-venv,python3-pip,ca-certificates

if [[ ${FORCE:-0} != 1 ]] && podman image exists "$IMAGE"; then
  echo "build-base: $IMAGE exists (FORCE=1 rebuilds)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build-base: debootstrap missing (run deploy/image/setup-podman.sh)" >&2; exit 1; }

start=$(date +%s)
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"
echo "build-base: debootstrap bookworm ($MIRROR) into $ROOTFS ..."
if ! debootstrap --variant=minbase --include="$PKGS" bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1; then
  tail -20 "$ROOTFS.log" >&2
  echo "build-base: debootstrap failed (full log: $ROOTFS.log)" >&2
  exit 1
fi
# Slim it: apt lists and caches, docs, man pages.
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* \
  "$ROOTFS"/usr/share/info/* "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/log/*.log
# Same apt sources as the host image a container engine user would get from python:3.11-slim.
echo "deb $MIRROR bookworm main" >"$ROOTFS/etc/apt/sources.list"
"$ROOTFS/usr/bin/python3" --version >/dev/null 2>&1 || chroot "$ROOTFS" python3 --version

echo "build-base: importing as $IMAGE ..."
tar -C "$ROOTFS" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$IMAGE" >/dev/null 2>"$ROOTFS.import.log" || { cat "$ROOTFS.import.log" >&2; exit 1; }
rm -rf "$ROOTFS"
echo "build-base: $IMAGE built in $(( $(date +%s) - start ))s ($(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
