"""``llmfleet up`` waits until the cluster is servable: after every process answers gRPC
health, the scheduler's readiness (health of ``llmfleet.v1.Scheduler``: every service not marked
``scale_to_zero`` has an engine with its model loaded) must say SERVING before "llmfleet is up" is
printed. Meanwhile the services still waiting for an engine are shown (``ListServices``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmfleet.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from llmfleet.rpc.channels import open_sync_channel

SCHEDULER_SERVICE = "llmfleet.v1.Scheduler"


def wait_servable(
    address: str,
    timeout_s: float,
    alive: Callable[[], bool],
    show: Callable[[str], None],
    interval_s: float = 0.2,
) -> tuple[bool, list[str]]:
    """Poll the scheduler at ``address`` until it is ready, ``timeout_s`` passes or ``alive()`` turns
    False; (ready, the services still without an engine). Each change of the missing set is shown."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    shown: tuple[str, ...] | None = None
    start = time.monotonic()
    missing: list[str] = []
    with open_sync_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        sched = scheduler_pb2_grpc.SchedulerStub(channel)
        while time.monotonic() < deadline and alive():
            try:
                status = health.Check(
                    health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE), timeout=2
                ).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return True, []
                services = sched.ListServices(scheduler_pb2.ListServicesRequest(), timeout=2).services
                missing = sorted(f"{s.name} ({s.model})" for s in services if not s.engines)
            except grpc.RpcError as e:
                missing = [f"(scheduler: {e.code().name})"]
            if tuple(missing) != shown:
                shown = tuple(missing)
                waited = time.monotonic() - start
                what = ", ".join(missing) if missing else "services that scale to zero only"
                show(f"[{waited:5.1f}s] waiting for placement to load: {what}")
            time.sleep(interval_s)
    return False, missing
