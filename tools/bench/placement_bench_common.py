"""What every section of ``placement_bench.py`` shares: the paper benchmarks' helpers (``C``), the one
SeaLLM setup (``S``, ``papers/seallm_setup.py``) and the cost source's label."""

from __future__ import annotations

import bench_common

C = bench_common.load()
COST = "roofline cost models on the catalog a100-80gb (not GPU-fitted)"
S = bench_common.load_seallm_setup()
MODELS4 = S.MODELS
CONTEXT = S.CONTEXT
