"""The machine a report was measured on."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """The CPU architecture and processor name, e.g. ``x86_64 x86_64``."""
    return f"{platform.machine()} {platform.processor() or ''}".strip()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, two decimals each."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
