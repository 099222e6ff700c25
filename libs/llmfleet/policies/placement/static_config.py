"""Static placement: the desired state is exactly the cluster config's engines -> models mapping.

The simplest plan (and the baseline later planners are compared with): engines listed in the config
get their listed models; engines that register but are not in the config get nothing; configured
engines that are not (yet) alive keep their entry so they load their models the moment they join.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmfleet.types import DesiredPlacement


@dataclass(frozen=True)
class PlanDiff:
    """Keys to write and to delete to move etcd's desired state to the plan."""

    put: tuple[DesiredPlacement, ...]
    delete: tuple[str, ...]


@dataclass(frozen=True)
class StaticConfigPlacement:
    placements: tuple[DesiredPlacement, ...]
    name: str = "static_config"

    def plan(self, live_engines: Iterable[str] = ()) -> list[DesiredPlacement]:
        """The desired placements (independent of which engines are live, by design)."""
        del live_engines
        return list(self.placements)

    def diff(self, current: Mapping[str, DesiredPlacement], live_engines: Iterable[str] = ()) -> PlanDiff:
        """What to change in the stored desired state ``current`` (engine id -> placement)."""
        want = {p.engine_id: p for p in self.plan(live_engines)}
        put = tuple(p for eid, p in sorted(want.items()) if current.get(eid) != p)
        delete = tuple(sorted(eid for eid in current if eid not in want))
        return PlanDiff(put=put, delete=delete)
