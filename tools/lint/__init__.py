"""Checks of the source tree beyond ruff and mypy, each run from the repository root as
``python -m tools.lint.<name>`` (``make lint``)."""
