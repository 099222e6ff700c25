"""Fault injection under load: every component killed or frozen (``python -m tools.chaos.chaos``, ``make chaos``)."""
