"""Helpers shared by the tools (chaos, soak, the benchmarks, the GPU checks).

- :mod:`tools.toolkit.stats`: percentiles and the median/min/max spread of repeated measurements;
- :mod:`tools.toolkit.procs`: resident memory of a process and its descendants, from ``/proc``;
- :mod:`tools.toolkit.host`: the machine and its load average, for the header of a report.
"""
