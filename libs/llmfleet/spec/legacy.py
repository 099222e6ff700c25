"""Old spellings, read for one release with a DeprecationWarning naming the new one."""

from __future__ import annotations

import warnings
from typing import Any


def renamed(data: Any, old: str, new: str, where: str) -> Any:
    """``data`` (a mapping about to be validated) with key ``old`` moved to ``new``; both is an error."""
    if not isinstance(data, dict) or old not in data:
        return data
    if new in data:
        raise ValueError(f"{where}: give {new} (or the deprecated {old}), not both")
    warnings.warn(f"{where}: {old} is deprecated: write {new}", DeprecationWarning, stacklevel=2)
    out = {k: v for k, v in data.items() if k != old}
    out[new] = data[old]
    return out
