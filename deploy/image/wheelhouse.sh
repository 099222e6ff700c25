#!/usr/bin/env bash
# Fills deploy/image/wheels/ (git-ignored) with every wheel the project image installs: CPU torch,
# the runtime dependencies of pyproject.toml and the build backend, pinned to the versions in the
# host's .venv (pip freeze as constraints), so the image runs what the host's tests ran.
# pip resolves them with the host's own pip configuration (PyPI, plus any find-links/local index the
# host has, which makes this fast). The image build bind-mounts the directory and installs with
# --find-links, so no wheel is copied into an image layer. Idempotent: skipped when the stamp
# (pyproject.toml + host freeze) is unchanged.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
OUT=deploy/image/wheels
mkdir -p "$OUT"

constraints=$OUT/constraints.txt
"$PY" -m pip freeze --exclude-editable --disable-pip-version-check | grep -v -i '^llmfleet' >"$constraints.new"
stamp=$( (cat pyproject.toml "$constraints.new"; echo "$TORCH_VERSION") | sha256sum | cut -c1-16)
if [[ -f $OUT/.stamp && $(cat "$OUT/.stamp") == "$stamp" ]]; then
  rm -f "$constraints.new"
  echo "wheelhouse: up to date ($(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1))"
  exit 0
fi
mv "$constraints.new" "$constraints"
reqs=$OUT/requirements.txt
"$PY" - >"$reqs" <<'PYEOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(deps["project"]["dependencies"] + deps["build-system"]["requires"] + ["pip"]))
PYEOF
echo "wheelhouse: downloading $(wc -l <"$reqs") requirements + torch==$TORCH_VERSION into $OUT ..."
start=$(date +%s)
# Into a fresh directory, swapped in at the end: the wheelhouse holds exactly the resolved set (the
# image build installs whatever versions it finds there).
rm -rf "$OUT.new" && mkdir -p "$OUT.new"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$OUT.new" \
  -c "$constraints" -r "$reqs" "torch==$TORCH_VERSION" 2> >(grep -v "is ignored: it is neither" >&2)
mv "$constraints" "$reqs" "$OUT.new/" && rm -rf "$OUT" && mv "$OUT.new" "$OUT"
echo "$stamp" >"$OUT/.stamp"
echo "wheelhouse: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1), $(( $(date +%s) - start ))s"
