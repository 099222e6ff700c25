"""Helpers shared by the scripts under ``tools/`` (chaos, soak, the benchmarks, the GPU checks).

The scripts are run by path, not installed, so each puts ``tools/`` on ``sys.path`` before importing
from here::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the shared toolkit

- :mod:`toolkit.stats`: percentiles and the median/min/max spread of repeated measurements;
- :mod:`toolkit.procs`: resident memory of a process and its descendants, from ``/proc``;
- :mod:`toolkit.host`: the machine and its load average, for the header of a report.
"""
