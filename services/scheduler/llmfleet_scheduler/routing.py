"""Per-service dispatch policies and batched length predictions for the scheduler.

``DispatchRouter``: each service gets its own policy object — the service's ``dispatch`` from the
cluster config (etcd ``services/{name}``) or the scheduler's ``--dispatch`` default — built once from
the policy registry with a :class:`~llmfleet.policies.dispatch.DispatchContext`, so the live scheduler
runs the very objects the simulator runs. The context carries the service's SLO (TTFT, TPOT), whether
engine load reports come in (the load monitor), and for policies that read costs
(``needs.reads_costs``: ``aladdin_bestfit``) the latency model of the service's model on ``--hardware``
from the default cost source (``costmodel.latency_model``; what the simulator and the emulated engines
charge) until a fitted profile is wired in. A policy that reads load where no load comes in is refused.

``PredictionBatcher``: concurrent requests are predicted with ONE profiler ``Predict`` call (requests
arriving within ``window_s`` share it). A profiler that is down or slow costs nothing but the
prediction: the request proceeds with ``None``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.coord.migration_state import MigrationState
from llmfleet.costmodel import hardware, latency_model, model_arch
from llmfleet.policies.dispatch import (
    POLICIES,
    DispatchContext,
    DispatchPolicy,
    check_context,
    dispatch_needs,
    make_dispatch_policy,
)
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.migration import MellView
from llmfleet.spec.defaults import DISPATCH_POLICY
from llmfleet.spec.services import ServiceSpec

from llmfleet_scheduler.directory import ClusterDirectory

log = logging.getLogger(__name__)


def mell_view_of(state: MigrationState | None) -> MellView | None:
    """The Mell view a migration leader published (None: no leader yet, or another policy)."""
    if state is None or not state.view:
        return None
    try:
        return MellView.from_json(state.view)
    except (ValueError, KeyError, TypeError) as e:
        log.warning(
            "migration_state epoch %d: unreadable Mell view (%s); dispatching by best fit", state.epoch, e
        )
        return None


class MellViewReader:
    """The Mell view the migration leader published, parsed once per publication: dispatch then reads
    one :class:`MellView` until the next, so its memo of the GPUs it opened since (``MellView.opened``)
    lasts until the leader's next epoch sees them. ``read``: the current state (None: no leader)."""

    def __init__(self, read: Callable[[], MigrationState | None]) -> None:
        self._read = read
        self._state: MigrationState | None = None
        self._view: MellView | None = None

    def __call__(self) -> MellView | None:
        state = self._read()
        if state is not self._state:
            self._state, self._view = state, mell_view_of(state)
        return self._view


@dataclass
class DispatchRouter:
    default: str = DISPATCH_POLICY
    hardware: str = "cpu"
    load_source: bool = True  # engine load reports reach the candidates (the load monitor runs)
    # the migration leader's Mell view (etcd migration_state), for the mell dispatch policy
    mell_view: Callable[[], MellView | None] | None = None
    # the default policy's constructor options (--dispatch-options); a service naming its own policy
    # builds it without them
    default_options: Mapping[str, Any] = field(default_factory=dict)
    _policies: dict[tuple[str, str], tuple[DispatchPolicy, dict[str, Any]]] = field(default_factory=dict)

    def check_default(self) -> None:
        """ValueError when the default policy cannot run here (it reads load and none comes in), or
        its options are refused (the policy is built once to find out)."""
        ctx = DispatchContext(load_source=self.load_source, hardware=self.hardware)
        try:
            check_context(self.default, dispatch_needs(self.default), ctx)
        except ValueError as e:
            blind = ", ".join(sorted(n for n in POLICIES if dispatch_needs(n).load_blind))
            raise ValueError(
                f"--dispatch {self.default}: {e}; drop --no-load-monitor or pick a load-blind policy: {blind}"
            ) from None
        if self.default_options:
            try:
                make_dispatch_policy(self.default, ctx, **self.default_options)
            except ValueError as e:
                raise ValueError(
                    f"--dispatch-options {json.dumps(dict(self.default_options))}: {e}"
                ) from None

    def name_for(self, spec: ServiceSpec) -> str:
        return spec.dispatch.policy if spec.dispatch is not None else self.default

    def wants_prediction(self, spec: ServiceSpec, mode: str) -> bool:
        """``always``/``never``; ``auto``: the service asks (``predict``) or its dispatch policy reads
        predictions (``needs.reads_predictions``) — a profiler round trip is not paid for nothing."""
        if mode != "auto":
            return mode == "always"
        return spec.predict or self.for_service(spec).needs.reads_predictions

    def policies(self) -> list[DispatchPolicy]:
        """The policy objects built so far (one per service and policy name)."""
        return [policy for policy, _ in self._policies.values()]

    def for_service(self, spec: ServiceSpec) -> DispatchPolicy:
        """The service's policy object (ValueError when it cannot be built or cannot run here)."""
        name = self.name_for(spec)
        options = spec.dispatch.options if spec.dispatch is not None else self.default_options
        key = (spec.name, name)
        built = self._policies.get(key)
        if built is not None and built[1] == options:  # a dict compare per request: an apply may change them
            return built[0]
        policy = make_dispatch_policy(name, self.context(name, spec), **options)
        if isinstance(policy, MellDispatch) and self.mell_view is not None:
            policy.view_source = self.mell_view  # arrivals go where the leader's Allocate would put them
        self._policies[key] = (policy, dict(options))
        return policy

    def context(self, name: str, spec: ServiceSpec) -> DispatchContext:
        """What the scheduler offers policy ``name`` serving ``spec``."""
        latency = {}
        if dispatch_needs(name).reads_costs:
            # the default cost source: what the simulator and the emulated engines charge
            latency = {spec.model: latency_model(model_arch(spec.model), hardware(self.hardware))}
        return DispatchContext(
            latency_models=latency,
            slos={spec.model: (spec.slo.ttft_s, spec.slo.tpot_s)},
            load_source=self.load_source,
            hardware=self.hardware,
        )


@dataclass
class _Pending:
    item: profiler_pb2.PredictItem
    future: asyncio.Future


@dataclass
class PredictionBatcher:
    directory: ClusterDirectory
    window_s: float = 0.002
    timeout_s: float = 0.5
    max_items: int = 64
    _pending: list[_Pending] = field(default_factory=list)
    _flusher: asyncio.Task | None = None
    calls: int = 0
    failures: int = 0

    async def predict(self, request_id: str, service: str, prompt: str) -> float | None:
        """Predicted output tokens for one request, or None (no profiler, error, timeout)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(
            _Pending(profiler_pb2.PredictItem(request_id=request_id, service=service, prompt=prompt), fut)
        )
        if len(self._pending) >= self.max_items:
            await self._flush()
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s + self.window_s + 0.1)
        except TimeoutError:
            return None

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.window_s)
        await self._flush()

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        result: dict[str, float] = {}
        prof = self.directory.first_of_role("profiler")
        if prof is not None:
            stub = profiler_pb2_grpc.ProfilerStub(self.directory.channel(prof.address))
            try:
                self.calls += 1
                resp = await stub.Predict(
                    profiler_pb2.PredictRequest(items=[p.item for p in batch]), timeout=self.timeout_s
                )
                result = {p.request_id: p.mean_output_tokens for p in resp.predictions}
            except grpc.aio.AioRpcError as e:
                self.failures += 1
                log.debug("profiler Predict failed (%s): dispatching without predictions", e.code())
        for p in batch:
            if not p.future.done():
                p.future.set_result(result.get(p.item.request_id))
