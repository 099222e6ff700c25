"""Processes seen through ``/proc``: a process's descendants and their resident memory."""

from __future__ import annotations

import contextlib
from pathlib import Path


def rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB from /proc (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (e.g. a console-script wrapper's child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for t in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (t / "children").read_text().split()]
    return out


def tree_rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` and its descendants, KiB (None when none of them is left)."""
    values = [r for p in tree_pids(pid) if (r := rss_kib(p)) is not None]
    return sum(values) if values else None
