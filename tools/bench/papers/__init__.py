"""Reproduction benchmark of the papers' headline experiments on the simulator (issue 6, ``make bench-papers``).

One module per paper (``seallm``, ``aladdin``, ``scls``, ``uellm``, ``mell``), each with the same workload
for every policy (a rate sweep; Mell: three setups × three workloads), the paper's baselines, and the
paper's claim beside ours; ``mell`` runs the headline section of ``tools/bench/migration_bench.py``.
``run.py`` drives them in one process and writes ``papers.json``, ``papers.md`` and one
``<paper>_*.png`` per paper. Shared helpers are in ``common``. Latencies come from the simulator's **roofline** cost models (catalog hardware × model; no
GPU-fitted profiles), so absolute numbers are those of an idealised engine.

Every scenario module exposes ``NAME``, ``TITLE``, ``run(quick=False, log=print) -> dict`` (JSON-ready:
``setup``, ``rows``, ``summary``, ``goal``, ``claim``, ``notes``), ``markdown(result) -> str`` and
``plot(result, out_dir) -> list[Path]``; ``run(..., tiny=True)`` is the smoke-test scale.
"""

SCENARIOS = ("seallm", "aladdin", "scls", "uellm", "mell")
