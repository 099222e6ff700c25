"""The control plane's metrics: ``llmfleet_*`` (never ``vllm:*``, which are the engines').

Scheduler (hooked in ``llmfleet_scheduler.relay``):
  ``llmfleet_scheduler_requests_total{service,model,outcome}``: requests ended; outcome = the finish
  reason (``stop``, ``eos``, ``length``, ``cancelled``, ...) or ``failed`` (an error status).
  ``llmfleet_scheduler_ttft_seconds{service}`` / ``llmfleet_scheduler_tpot_seconds{service}``: time to
  first token and time per output token after the first, as the client sees them (scheduler clock).
  ``llmfleet_scheduler_dispatch_total{service,engine}``: dispatch decisions per engine (failovers
  included). ``llmfleet_scheduler_requests_in_flight``: requests being relayed now.
  ``llmfleet_scheduler_rejected_total{service,reason}``: refused by admission control (``overloaded``),
  by an API key's service list (``forbidden``) or by its rate limits (``rate_limited``).
  ``llmfleet_scheduler_rate_limited_total{key,limit}``: refused by an API key's rate limits, by key name
  and limit (``requests``: requests/s, ``tokens``: tokens/min). ``llmfleet_scheduler_waiting{service}``:
  requests admitted without a first token yet. ``llmfleet_scheduler_prompt_token_scale{model}``: the
  engines' prompt tokens per token the scheduler's regex estimated (``llmfleet.token_estimate.PromptTokens``).
  ``llmfleet_scheduler_key_requests_total{key,priority,outcome}``: requests by API key name ("" with
  keys off) and priority: ``admitted``, ``refused`` (overloaded, or displaced by a higher priority) and
  ``shed`` (sheddable, dropped from the hold queue before its TTFT SLO);
  ``llmfleet_scheduler_key_wait_seconds{key,priority}``: time a request waited in the hold queue
  before dispatch (its count: the requests that waited). Labels stay few: keys come from the keys file
  and a request's priority is bounded (``llmfleet.policies.capacity.priority``).
Front (``llmfleet-front``, hooked in ``llmfleet_front.http_metrics`` and ``llmfleet_front.backend``):
  ``llmfleet_front_requests_total{route,status}``: HTTP requests answered, by route (the app's path
  template, ``other`` for an unknown path) and HTTP status; ``llmfleet_front_ttfb_seconds{route}``: time
  from a request's arrival to the first byte of its response body; ``llmfleet_front_streams_open{route}``:
  server-sent event streams being written; ``llmfleet_front_tokens_streamed_total``: tokens relayed from
  the schedulers to clients (each once across resumes); ``llmfleet_front_upstream_errors_total{code}``:
  a request's attempt on a scheduler that ended with a gRPC status (``UNAVAILABLE`` also when no
  scheduler is known); ``llmfleet_front_resumes_total``: attempts continued on the next replica after
  ``UNAVAILABLE``; ``llmfleet_front_submit_many_calls``: ``SubmitMany`` calls open to the schedulers
  (one per API key and replica in use). With ``--workers N`` the workers write them to files the parent
  sums for each scrape (prometheus-client's multiprocess mode; the gauges are live sums).
Placement (``llmfleet_placement.live``): ``llmfleet_placement_changes_total`` (plans written),
  ``llmfleet_placement_leader_changes_total`` (this replica became leader), ``llmfleet_placement_plan_id``.
Migration (``llmfleet_migration``): ``llmfleet_migrations_total{outcome}`` (done, gone, failed),
  ``llmfleet_migration_epochs_total``, ``llmfleet_migration_epoch`` (the leader's epoch counter).
Shared shell: ``llmfleet_etcd_lease_losses_total{role}`` (the registration's lease was lost).
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmfleet.metrics.engine import ITL_BUCKETS, TTFT_BUCKETS
from llmfleet.metrics.server import process_registry

_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[CollectorRegistry, dict[type, object]] = weakref.WeakKeyDictionary()


def _once(cls: type, registry: CollectorRegistry | None):
    reg = registry or process_registry()
    with _lock:
        per = _cache.setdefault(reg, {})
        if cls not in per:
            per[cls] = cls(reg)
        return per[cls]


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmfleet_scheduler_requests",
            "Requests the scheduler ended, by service, model and outcome.",
            ["service", "model", "outcome"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "llmfleet_scheduler_requests_in_flight", "Requests being relayed now.", registry=registry
        )
        self.ttft = Histogram(
            "llmfleet_scheduler_ttft_seconds",
            "Time to first token as the client sees it (scheduler arrival to first token).",
            ["service"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "llmfleet_scheduler_tpot_seconds",
            "Time per output token after the first, as the client sees it.",
            ["service"],
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.rejected = Counter(
            "llmfleet_scheduler_rejected",
            "Requests refused before any work: overloaded (admission control), forbidden (API key's "
            "services) or rate_limited (API key's rate limits).",
            ["service", "reason"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "llmfleet_scheduler_rate_limited",
            "Requests refused by an API key's rate limits, by key name and limit (requests, tokens).",
            ["key", "limit"],
            registry=registry,
        )
        self.prompt_token_scale = Gauge(
            "llmfleet_scheduler_prompt_token_scale",
            "Prompt tokens the engines counted per token the scheduler's regex estimated, by model "
            "(the factor its prompt estimates are scaled by).",
            ["model"],
            registry=registry,
        )
        self.waiting = Gauge(
            "llmfleet_scheduler_waiting",
            "Requests admitted that have no first token yet, by service (admission control).",
            ["service"],
            registry=registry,
        )
        self.key_requests = Counter(
            "llmfleet_scheduler_key_requests",
            "Requests by API key and priority: admitted, refused (overloaded or displaced by a higher "
            "priority) or shed (sheddable, dropped from the hold queue before its TTFT SLO).",
            ["key", "priority", "outcome"],
            registry=registry,
        )
        self.key_wait_seconds = Histogram(
            "llmfleet_scheduler_key_wait_seconds",
            "Time a request waited in the scheduler's hold queue before dispatch, by API key and priority.",
            ["key", "priority"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.dispatch = Counter(
            "llmfleet_scheduler_dispatch",
            "Dispatch decisions, by service and chosen engine.",
            ["service", "engine"],
            registry=registry,
        )

        # requests held in the scheduler for capacity: reason cold = no engine hosts the
        # model yet (scale from zero), saturated = every engine hosting it is full (late binding)
        self.held = Gauge(
            "llmfleet_scheduler_held",
            "Requests held in the scheduler waiting for capacity, by service and reason (cold, saturated).",
            ["service", "reason"],
            registry=registry,
        )
        self.held_seconds = Histogram(
            "llmfleet_scheduler_held_seconds",
            "Time a request waited in the scheduler for capacity before dispatch (or its timeout), by reason.",
            ["service", "reason"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.cold_starts = Counter(
            "llmfleet_scheduler_cold_starts",
            "Requests that arrived for a model no engine hosted (scale from zero), by service and outcome "
            "(served: an engine loaded it in time; timeout; unplaceable; cancelled).",
            ["service", "outcome"],
            registry=registry,
        )

    def arrived(self) -> None:
        self.in_flight.inc()

    def dispatched(self, service: str, engine: str) -> None:
        self.dispatch.labels(service, engine).inc()

    def finished(
        self,
        service: str,
        model: str,
        outcome: str,
        arrival: float,
        first_token_at: float | None,
        finished_at: float | None,
        n_tokens: int,
    ) -> None:
        self.in_flight.dec()
        self.requests.labels(service, model, outcome).inc()
        if first_token_at is not None:
            self.ttft.labels(service).observe(max(0.0, first_token_at - arrival))
            if finished_at is not None and n_tokens > 1:
                self.tpot.labels(service).observe(max(0.0, (finished_at - first_token_at) / (n_tokens - 1)))


class FrontMetrics:
    """The OpenAI front's metrics; its gauges sum over live worker processes in multiprocess mode."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmfleet_front_requests",
            "HTTP requests the front answered, by route (path template; other: an unknown path) and status.",
            ["route", "status"],
            registry=registry,
        )
        self.ttfb = Histogram(
            "llmfleet_front_ttfb_seconds",
            "Time from a request's arrival to the first byte of its response body, by route.",
            ["route"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.streams_open = Gauge(
            "llmfleet_front_streams_open",
            "Server-sent event streams being written, by route.",
            ["route"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.tokens_streamed = Counter(
            "llmfleet_front_tokens_streamed",
            "Tokens relayed from the schedulers to clients (each once across resumes).",
            registry=registry,
        )
        self.upstream_errors = Counter(
            "llmfleet_front_upstream_errors",
            "Request attempts on a scheduler that ended with a gRPC status, by code (UNAVAILABLE also "
            "when no scheduler is known).",
            ["code"],
            registry=registry,
        )
        self.resumes = Counter(
            "llmfleet_front_resumes",
            "Request attempts continued on the next scheduler replica after UNAVAILABLE.",
            registry=registry,
        )
        self.submit_many_calls = Gauge(
            "llmfleet_front_submit_many_calls",
            "SubmitMany calls open to the schedulers (one per API key and replica in use).",
            multiprocess_mode="livesum",
            registry=registry,
        )

    def call_opened(self, opened: bool) -> None:
        """A ``SubmitMany`` call opened (True) or ended (False)."""
        if opened:
            self.submit_many_calls.inc()
        else:
            self.submit_many_calls.dec()


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.changes = Counter(
            "llmfleet_placement_changes",
            "Placement plans written to etcd by this replica.",
            registry=registry,
        )
        self.leader_changes = Counter(
            "llmfleet_placement_leader_changes",
            "Times this replica became the placement leader.",
            registry=registry,
        )
        self.plan_id = Gauge(
            "llmfleet_placement_plan_id", "The id of the latest plan this replica wrote or adopted.",
            registry=registry,
        )  # fmt: skip


class MigrationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.migrations = Counter(
            "llmfleet_migrations", "Migrations run by the migration leader, by outcome.", ["outcome"],
            registry=registry,
        )  # fmt: skip
        self.epochs = Counter(
            "llmfleet_migration_epochs", "Migration epochs run by this replica.", registry=registry
        )
        self.epoch = Gauge(
            "llmfleet_migration_epoch", "The leader's migration epoch counter.", registry=registry
        )


class ShellMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lease_losses = Counter(
            "llmfleet_etcd_lease_losses",
            "Times the node's etcd registration lease was lost (and re-granted).",
            ["role"],
            registry=registry,
        )


def scheduler_metrics(registry: CollectorRegistry | None = None) -> SchedulerMetrics:
    return _once(SchedulerMetrics, registry)


def front_metrics(registry: CollectorRegistry | None = None) -> FrontMetrics:
    return _once(FrontMetrics, registry)


def placement_metrics(registry: CollectorRegistry | None = None) -> PlacementMetrics:
    return _once(PlacementMetrics, registry)


def migration_metrics(registry: CollectorRegistry | None = None) -> MigrationMetrics:
    return _once(MigrationMetrics, registry)


def shell_metrics(registry: CollectorRegistry | None = None) -> ShellMetrics:
    return _once(ShellMetrics, registry)
