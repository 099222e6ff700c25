"""Shared fixtures for the CLI and supervisor tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def wait_gone(pid: int, within: float = 10.0) -> bool:
    """True once ``pid`` no longer exists (a zombie counts as gone: it no longer runs)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def gone() -> Callable[..., bool]:
    return wait_gone
