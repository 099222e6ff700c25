"""What every section of ``placement_bench`` shares besides the paper benchmarks' helpers
(``tools.bench.papers.common``): the one SeaLLM setup (``S``, ``papers/seallm_setup.py``) and the cost
source's label."""

from __future__ import annotations

from tools.bench.papers import seallm_setup as S

COST = "roofline cost models on the catalog a100-80gb (not GPU-fitted)"
MODELS4 = S.MODELS
