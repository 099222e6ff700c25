"""The benchmarks, each a module run from the repository root as ``python -m tools.bench.<name>`` (``make bench-*``)."""
