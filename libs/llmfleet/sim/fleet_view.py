"""What the fleet's parts (:mod:`~llmfleet.sim.holds`, :mod:`~llmfleet.sim.moves`,
:mod:`~llmfleet.sim.fleet_changes`) use of the
:class:`~llmfleet.sim.fleet.Fleet` they belong to: its public API, as a protocol, so that a part
depends on the interface and the fleet on its parts (no import cycle)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import DispatchRequest
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.sim.events import EventQueue
from llmfleet.sim.instance import SimInstance
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService, SimSpec
from llmfleet.spec.defaults import Binding, Fairness


class FleetView(Protocol):
    spec: SimSpec
    events: EventQueue
    instances: dict[str, SimInstance]
    binding: Binding
    saturation: Saturation
    cold_start: bool
    fairness: Fairness
    preemption: PreemptionRule | None
    wake: Callable[[float], None] | None

    def serves(self, model: str) -> bool: ...

    def coming(self, model: str) -> bool: ...

    def service(self, name: str) -> SimService: ...

    def locate(self, request_id: str) -> SimInstance | None: ...

    def kv_transfer_s(self, model: str, tokens: int) -> float: ...

    def dispatch_request(
        self,
        request_id: str,
        svc: SimService,
        prompt_tokens: int,
        predicted: float | None,
        now: float,
        prompt: str = "",
        session: str = "",
    ) -> DispatchRequest: ...

    def prompt_of(self, wr: object) -> tuple[str, str]: ...

    def pick_instance(
        self,
        svc: SimService,
        req: DispatchRequest,
        exclude: frozenset[str] = frozenset(),
        *,
        late: bool = False,
    ) -> str: ...

    def admit(
        self, rec: RequestRecord, svc: SimService, iid: str, predicted: float | None, now: float
    ) -> None: ...

    def track(self, request_id: str, inst: SimInstance) -> None: ...

    def release(self, request_id: str) -> None: ...

    def kick(self, inst: SimInstance, now: float) -> None: ...

    def new_instance(self, p: InstancePlan) -> SimInstance: ...

    def check_models(self, models: Sequence[str], tp: int, what: str) -> tuple[str, ...]: ...

    def load_time_s(self, models: Sequence[str], tp: int) -> float: ...

    def hosting(self) -> dict[str, tuple[int, tuple[str, ...]]]: ...
