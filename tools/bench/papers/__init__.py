"""Reproduction benchmark of the papers' headline experiments on the simulator (``make bench-papers``).

One module per paper (``seallm``, ``aladdin``, ``scls``, ``uellm``, ``mell``), each with the same workload
for every policy, the paper's baselines, and the paper's claim beside ours. ``run.py`` runs their units
on one pool of worker processes and writes ``papers.json``, ``papers.md`` and one ``<paper>_*.png`` per
paper. Shared helpers are in ``common``; costs come from the simulator's cost source (``--cost-source``,
default the simulator's).

Every scenario module exposes ``NAME``, ``TITLE``, ``run(quick=False, log=print) -> dict`` (JSON-ready:
``setup``, ``rows``, ``summary``, ``goal``, ``claim``, ``notes``), ``markdown(result) -> str`` and
``plot(result, out_dir) -> list[Path]``; ``run(..., tiny=True)`` is the smoke-test scale. A module may
also expose ``parts(quick, tiny) -> [(key, expected seconds, args)]``, ``run_part(args)`` and
``combine(parts, quick, tiny, log)``: run.py then runs each part as its own unit. A part given as
``(key, expected seconds, args, after)`` waits for the parts keyed in ``after`` and runs as
``run_part(args, {key: their result})``.
"""

SCENARIOS = ("seallm", "aladdin", "scls", "uellm", "mell")
