"""Thousands of concurrent streams with no faults (``python -m tools.soak.soak``, ``make soak``)."""
