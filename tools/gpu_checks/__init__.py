"""Checks that need a GPU: engine costs, vLLM, HELR device maps (``python -m tools.gpu_checks.gpu_check``, ``make gpu-check``)."""
