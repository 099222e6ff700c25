"""Reproduction benchmark of the papers' headline experiments on the simulator (issue 6, ``make bench-papers``).

One module per paper (``seallm``, ``aladdin``, ``scls``, ``uellm``), each with a rate sweep over the same
workload for every policy, the paper's baselines, and the paper's claim beside ours; ``run.py`` drives them
and writes ``papers.json``, ``papers.md`` and one ``<paper>_*.png`` per paper. Shared helpers are in
``common``. Latencies come from the simulator's **roofline** cost models (catalog hardware × model; no
GPU-fitted profiles), so absolute numbers are those of an idealised engine.

Every scenario module exposes ``NAME``, ``TITLE``, ``run(quick=False, log=print) -> dict`` (JSON-ready:
``setup``, ``rows``, ``summary``, ``goal``, ``claim``, ``notes``), ``markdown(result) -> str`` and
``plot(result, out_dir) -> list[Path]``; ``run(..., tiny=True)`` is the smoke-test scale.
"""

SCENARIOS = ("seallm", "aladdin", "scls", "uellm")
