#!/usr/bin/env bash
# Podman + podman-compose + debootstrap for building and running the llmfleet images without a
# container registry (Debian bookworm host, root). Idempotent: installs only what is missing and
# rewrites /etc/containers/containers.conf only when its content differs.
set -euo pipefail

need=()
for pair in podman:podman runc:runc podman-compose:podman-compose debootstrap:debootstrap; do
  cmd=${pair%%:*} pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup-podman: installing ${need[*]} ..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# default_ulimits = []: without it every container fails to start here ("error setting rlimit type 7
# [nofile]: operation not permitted"): the host is itself an unprivileged container. runtime = "runc":
# the OCI runtime installed above (podman 4.3 otherwise looks for crun first, which is not installed).
conf=/etc/containers/containers.conf
want='# written by deploy/image/setup-podman.sh
[containers]
default_ulimits = []

[engine]
runtime = "runc"'
mkdir -p /etc/containers
if [[ ! -f $conf ]] || [[ "$(cat "$conf")" != "$want" ]]; then
  [[ -f $conf ]] && cp "$conf" "$conf.bak.$(date +%s)"
  printf '%s\n' "$want" >"$conf"
  echo "setup-podman: wrote $conf"
fi
echo "setup-podman: $(podman --version), $(runc --version | head -1), $(podman-compose version 2>/dev/null | grep -i "compose.* version" | head -1)"
