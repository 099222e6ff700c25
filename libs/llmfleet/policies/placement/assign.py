"""Map a placement plan onto a pool of existing engines, moving as few models as possible.

A planner speaks in instances (``tp`` GPUs hosting some models); the fleet has engines of fixed size
that already host models. :func:`assign_plan` gives each plan instance an engine of the same ``tp``:

1. engines already hosting exactly the instance's models keep them (nothing moves);
2. then the remaining (instance, engine) pairs by most models already resident, fewest models to
   unload, then engine id — so a replacement loads and unloads the least;
3. engines left without an instance are idle (no models): scale-in drains and releases them.

The result names every engine of the pool (``()`` for idle). Raises :class:`PlacementInfeasible` when
the plan needs more engines of some ``tp`` than the pool has. Pure: the simulator and the live
placement leader call the same function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmfleet.policies.placement.base import InstancePlan, PlacementInfeasible


@dataclass(frozen=True)
class EngineSlot:
    """An engine of the pool: its id, its size in GPUs and the models it hosts now."""

    engine_id: str
    tp: int = 1
    models: tuple[str, ...] = ()


def assign_plan(plan: Sequence[InstancePlan], pool: Sequence[EngineSlot]) -> dict[str, tuple[str, ...]]:
    """engine_id -> the models it should host (``()``: idle), for every engine of ``pool``."""
    out: dict[str, tuple[str, ...]] = {e.engine_id: () for e in pool}
    if len(out) != len(pool):
        raise ValueError("engine ids in the pool must be unique")
    by_tp: dict[int, list[EngineSlot]] = {}
    for e in pool:
        by_tp.setdefault(e.tp, []).append(e)
    want: dict[int, list[InstancePlan]] = {}
    for p in plan:
        want.setdefault(p.tp, []).append(p)
    for tp, insts in sorted(want.items()):
        engines = by_tp.get(tp, [])
        if len(insts) > len(engines):
            sizes = ", ".join(f"{n}×tp{t}" for t, n in sorted((t, len(v)) for t, v in by_tp.items()))
            raise PlacementInfeasible(
                f"the plan needs {len(insts)} engines of tp={tp} but the pool has "
                f"{len(engines)} ({sizes or 'no engines'})"
            )
        free = {e.engine_id: e for e in engines}
        left = list(insts)
        # 1. exact matches keep their models
        for p in list(left):
            match = sorted(eid for eid, e in free.items() if set(e.models) == set(p.models))
            if match:
                out[match[0]] = tuple(p.models)
                del free[match[0]]
                left.remove(p)
        # 2. most overlap, fewest unloads, then engine id
        pairs = sorted(
            (
                -len(set(p.models) & set(e.models)),
                len(set(e.models) - set(p.models)),
                eid,
                i,
            )
            for i, p in enumerate(left)
            for eid, e in free.items()
        )
        done: set[int] = set()
        for _, _, eid, i in pairs:
            if i in done or eid not in free:
                continue
            out[eid] = tuple(left[i].models)
            del free[eid]
            done.add(i)
    return out


def moves(current: Mapping[str, Sequence[str]], target: Mapping[str, Sequence[str]]) -> int:
    """Models loaded plus unloaded to go from ``current`` to ``target`` (engine id -> models)."""
    n = 0
    for eid in set(current) | set(target):
        a, b = set(current.get(eid, ())), set(target.get(eid, ()))
        n += len(a ^ b)
    return n


def gpus_in_use(assignment: Mapping[str, Sequence[str]], pool: Sequence[EngineSlot]) -> int:
    """GPUs of the engines hosting at least one model."""
    return sum(e.tp for e in pool if assignment.get(e.engine_id))
