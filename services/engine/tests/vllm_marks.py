"""Marks of the tests that run the real vLLM backend: ``-m vllm`` selects them (``make test-vllm``).

Where vLLM is not installed they are skipped with the command that installs it, except in CI
(``CI=true``), which installs vLLM first (``.ci/run``): there a missing vLLM fails them instead.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
# vLLM's CPU attention kernels need a head size that is a multiple of 32: tiny://mistral's is 32
VLLM_TINY_SOURCE = "tiny://mistral"
# where the vLLM tests run their engines: the CPU here, cuda under `make gpu-check`
VLLM_DEVICE = os.environ.get("LLMFLEET_VLLM_DEVICE", "cpu")

requires_vllm = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_INSTALLED and os.environ.get("CI") != "true",
        reason="vLLM is not installed: make setup-vllm",
    ),
]
