"""Byte sizes as a cluster file and a command line write them: ``65536``, ``64KiB``, ``2GiB``, ``1.5GB``."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {
    **{"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30},
    **{"k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9},
}


def size_bytes(value: int | str) -> int:
    """``1073741824``, ``"64KiB"``, ``"2GiB"``, ``"1.5GB"`` -> bytes (ValueError naming the text)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r} (e.g. 1073741824, 512MiB, 2GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _size(value: Any) -> Any:
    return size_bytes(value) if isinstance(value, str) else value


ByteSize = Annotated[int, BeforeValidator(_size)]  # an int field that also takes "64KiB", "2GiB", ...
