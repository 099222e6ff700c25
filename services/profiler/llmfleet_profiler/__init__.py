"""Profiler service: output-length prediction (and, later, resource characterization)."""
