"""Developer tools of the repository (benchmarks, chaos, soak, GPU checks), run from its root as ``python -m tools.<package>.<script>``."""
