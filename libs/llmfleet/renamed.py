"""Spellings that changed: each is refused with an error naming the current one.

One table for every reader: the cluster file's services, SLOs and engines, the simulator's services
files, the engine-local policies' options, and the command lines of ``llmfleet sim`` and
``llmfleet-engine``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

SERVICE = "service"
SLO = "slo"
SIM_SERVICE = "simulated service"
ENGINE = "engine"
ENGINE_POLICY_OPTIONS = "engine policy options"
SIM_FLAGS = "llmfleet sim"
ENGINE_FLAGS = "llmfleet-engine"

# reader -> old spelling -> the current one
RENAMED: dict[str, dict[str, str]] = {
    SERVICE: {
        "default_max_tokens": "max_tokens",
        "dispatch_options": "dispatch: {policy: NAME, options: {...}}",
        "deadline_s": "slo: {deadline_s: ...}",
    },
    SLO: {"atgt_s": "tpot_s (Aladdin's average token generation time)"},
    SIM_SERVICE: {
        **{key: f"slo: {{{key}: ...}}" for key in ("ttft_s", "tpot_s", "latency_scale", "deadline_s")},
        "atgt_s": "slo: {tpot_s: ...}",
    },
    ENGINE: {"policy_options": "options"},
    ENGINE_POLICY_OPTIONS: {"keep_kv": "slice_end: keep|recompute"},
    SIM_FLAGS: {"--local": "--engine-policy"},
    ENGINE_FLAGS: {"--slice-end": '--policy-options \'{"slice_end": "keep|recompute"}\''},
}


def renamed_message(reader: str, old: str) -> str:
    return f"{old} was renamed: write {RENAMED[reader][old]}"


def refuse_renamed(data: Any, reader: str) -> None:
    """ValueError naming the current spelling when mapping ``data`` uses an old key of ``reader``."""
    if not isinstance(data, Mapping):
        return
    for old in RENAMED[reader]:
        if old in data:
            raise ValueError(renamed_message(reader, old))


class _RenamedFlag(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(renamed_message(self.const, option_string or self.option_strings[0]))


def add_renamed_flags(parser: argparse.ArgumentParser, reader: str) -> None:
    """Register ``reader``'s old flags on ``parser``, each a usage error naming the current one."""
    for old in RENAMED[reader]:
        parser.add_argument(
            old,
            action=_RenamedFlag,
            const=reader,
            nargs="?",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
