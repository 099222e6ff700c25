"""The migration leader's decisions over a run, in the simulator's ``report["migration"]`` form.

The leader keeps only its last epochs and moves in memory (``Migration.Status``; etcd's
``migration_state`` holds just the latest epoch and active set), so a live run polls Status often
enough and merges what it saw: epochs by number, moves by migration id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def migration_summary(
    policy: str,
    epoch_s: float,
    epochs: Mapping[int, Mapping[str, Any]],
    moves: Mapping[str, Mapping[str, Any]],
    t0_unix: float = 0.0,
) -> dict[str, Any]:
    """Totals with ``MigrationStats``' keys where the live leader reports them, plus ``moves`` (each
    finished move) and ``activations`` (epochs that changed the active set); times are seconds from
    ``t0_unix`` (the run's start)."""
    ep = [epochs[k] for k in sorted(epochs)]
    done = [m for m in moves.values() if m.get("state") == "done"]
    return {
        "policy": policy,
        "epoch_s": epoch_s,
        "epochs": len(ep),
        "operations": sum(int(e.get("operations", 0)) for e in ep),
        "planned": sum(int(e.get("planned", 0)) for e in ep),
        "executed": sum(int(e.get("executed", 0)) for e in ep),
        "failed": sum(int(e.get("failed", 0)) for e in ep),
        "deferred": sum(int(e.get("deferred", 0)) for e in ep),
        "cancelled": sum(int(e.get("cancelled", 0)) for e in ep),
        "kv_moves": sum(1 for m in done if m.get("mode") == "kv"),
        "token_moves": sum(1 for m in done if m.get("mode") == "tokens"),
        "kv_bytes_moved": sum(int(m.get("kv_bytes", 0)) for m in done),
        "transfer_s_total": sum(float(m.get("seconds", 0.0)) for m in done),
        "max_per_epoch": max((int(e.get("executed", 0)) for e in ep), default=0),
        "moves": [dict(m) for _, m in sorted(moves.items())],
        "activations": [
            {
                "t": float(e.get("time", 0.0)) - t0_unix,
                "epoch": e.get("epoch"),
                "activated": list(e.get("activated", ())),
                "deactivated": list(e.get("deactivated", ())),
                "active_engines": e.get("active_engines"),
            }
            for e in ep
            if e.get("activated") or e.get("deactivated")
        ],
    }
