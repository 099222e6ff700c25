"""A live run's report in ``llmfleet sim``'s schema, computed by the simulator's own metric code.

Each outcome becomes a :class:`~llmfleet.sim.records.RequestRecord` (client-side times from the run's
start; output tokens = the completion tokens the engine actually produced; ``solo_s`` = the request's
execution time alone from the same cost model the simulator uses, on the serving engine's hardware at
the model's reference TP, ``sim.spec.reference_tp``), the etcd samples become the ``gpu_log`` and the
cluster samples, and :func:`llmfleet.sim.metrics.summarize` does the rest. Figures a live run cannot observe (busy
GPU-seconds, iterations, KV utilisation, events) are ``None``; normalized latency and SeaLLM
attainment are absent (``n`` 0, ``None``) when no model has a cost-model catalog name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.costmodel import UnknownModel, hardware, model_arch
from llmfleet.costmodel.hardware import Hardware, UnknownHardware
from llmfleet.replay.fleet import FleetSample, gpu_log, placement_decisions
from llmfleet.sim.cost import DEFAULT_COST_SOURCE, CostBook
from llmfleet.sim.metrics import dist, summarize
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Sample, SimResult
from llmfleet.sim.spec import SimService, reference_tp

# cluster figures only a simulation observes
UNOBSERVED = (
    "gpu_seconds_busy",
    "fluid_bound_gpus",
    "active_kv_utilization_mean",
    "active_memory_utilization_mean",
    "kv_utilization_mean",
    "kv_utilization_peak",
    "iterations",
    "adapter_loads",  # the engines count them on /metrics (llmfleet_lora_adapter_loads_total)
    "static_batches",
    "early_return_fraction",
    "events",
    "events_per_s",
)


@dataclass
class LiveOutcome:
    """One sent request: its times in seconds from the run's start (``planned_s``: the workload's
    arrival; ``arrival_s``: when it was sent), what came back, and why it failed (``""``: it did not).
    ``engine_ttft_s``: the serving engine's own TTFT, from its receipt of the request (None: not
    reported, e.g. through the HTTP API or after a migration); ``scheduler_ttft_s`` and
    ``scheduler_queue_s``: the scheduler's TTFT and its time to choose an engine, both from its receipt
    of the request (None: not reported, through the HTTP API); ``cached_tokens``: the prompt tokens
    its (first) engine found in its prefix cache, from the final usage (None: not reported)."""

    request_id: str
    service: str
    planned_s: float
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    first_token_s: float | None = None
    finish_s: float | None = None
    completion_tokens: int = 0
    engine_id: str = ""
    finish_reason: str = ""
    error: str = ""
    text: str = field(default="", repr=False)  # the completion (a closed-loop turn resends it)
    engine_ttft_s: float | None = None
    scheduler_ttft_s: float | None = None
    scheduler_queue_s: float | None = None
    cached_tokens: int | None = None  # prompt tokens its engine found in its prefix cache (None: not told)

    @property
    def ok(self) -> bool:
        return not self.error and self.finish_s is not None

    @property
    def first_s(self) -> float | None:
        """When its first token came (its finish when it streamed none)."""
        return self.first_token_s if self.first_token_s is not None else self.finish_s


@dataclass
class SoloTimes:
    """A request's execution time alone (the simulator's ``CostBook.solo_time``) on ``hw_name``
    hardware (else ``default_hardware``) at the model's reference TP there (``sim.spec.reference_tp``,
    as the simulator's, whatever the TP of the engine that served it); 0.0 when the model or the
    hardware is not in the catalog."""

    default_hardware: str | None = None
    cost_source: str = DEFAULT_COST_SOURCE
    _books: dict[tuple[str, str], tuple[CostBook, Hardware] | None] = field(default_factory=dict, repr=False)

    def book(self, model: str, hw_name: str) -> tuple[CostBook, Hardware] | None:
        """The cost book of ``model`` on ``hw_name`` (else the default hardware) and that hardware."""
        key = (model, hw_name)
        if key not in self._books:
            found = None
            for name in (hw_name, self.default_hardware):
                if not name:
                    continue
                try:
                    hw = hardware(name)
                    book = CostBook.build(hw, {model: model_arch(model)}, source=self.cost_source)
                    found = (book, hw)
                    break
                except (UnknownHardware, UnknownModel):
                    continue
            self._books[key] = found
        return self._books[key]

    def __call__(self, model: str, hw_name: str, prompt_tokens: int, output_tokens: int) -> float:
        found = self.book(model, hw_name)
        if found is None:
            return 0.0
        book, hw = found
        tp = reference_tp(model_arch(model), hw)
        return book.solo_time(model, tp, max(prompt_tokens, 1), max(output_tokens, 1))

    def sources(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for found in self._books.values():
            if found is not None:
                out.update(found[0].sources())
        return out

    def references(self) -> list[dict[str, Any]]:
        """What normalized latency divided by (``SimSpec.normalized_reference``'s form): each model's
        hardware and reference TP, for the models priced."""
        seen = {(m, found[1].name): found[1] for (m, _), found in self._books.items() if found is not None}
        return [
            {"model": m, "hardware": name, "tp": reference_tp(model_arch(m), hw)}
            for (m, name), hw in sorted(seen.items())
        ]


def _engines(samples: Sequence[FleetSample]) -> dict[str, tuple[int, str]]:
    """engine id -> (tp, hardware), the last seen."""
    out: dict[str, tuple[int, str]] = {}
    for s in samples:
        for e in s.engines:
            out[e.engine_id] = (max(e.tp, 1), e.hardware)
    return out


def records_of(
    outcomes: Sequence[LiveOutcome],
    services: Sequence[SimService],
    engines: Mapping[str, tuple[int, str]],
    solo: SoloTimes | None = None,
) -> list[RequestRecord]:
    """Simulator records of the outcomes (model: the service's, a catalog name when it has one)."""
    model = {s.name: s.model for s in services}
    out = []
    for o in outcomes:
        _, hw = engines.get(o.engine_id, (1, ""))
        produced = o.completion_tokens if o.ok else 0
        rec = RequestRecord(
            o.request_id, o.service, model.get(o.service, ""), o.arrival_s, o.prompt_tokens,
            max(produced, 1) if o.ok else o.max_tokens, instance=o.engine_id, produced=produced,
            failed="" if o.ok else (o.error or "no answer"),
        )  # fmt: skip
        if o.ok:
            rec.finish_s = o.finish_s
            rec.first_token_s = o.first_s
            rec.cached_tokens = o.cached_tokens
        if solo is not None and rec.model:
            rec.solo_s = solo(rec.model, hw, o.prompt_tokens, rec.output_tokens)
        out.append(rec)
    return out


def live_rows(outcomes: Sequence[LiveOutcome], records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """``requests.jsonl`` rows of a live run: each request as ``llmfleet sim --records`` writes it (its
    record: the same fields, ``arrival_s`` when it was sent, ``instance`` the engine that served it
    last), with what only a live run knows: ``planned_s`` (the workload's arrival), the engine's own
    TTFT, the scheduler's TTFT and queue time (None: not reported) and the finish reason."""
    return [
        {
            **r.to_dict(),
            "planned_s": o.planned_s,
            "engine_ttft_s": o.engine_ttft_s,
            "scheduler_ttft_s": o.scheduler_ttft_s,
            "scheduler_queue_s": o.scheduler_queue_s,
            "finish_reason": o.finish_reason,
        }
        for o, r in zip(outcomes, records, strict=True)
    ]


@dataclass(frozen=True)
class LiveRun:
    """A live run as ``llmfleet sim`` reports one: ``report`` (``runs[i]``) and its requests' ``rows``
    (:func:`live_rows`)."""

    report: dict
    rows: list[dict[str, Any]]


def cluster_samples(
    samples: Sequence[FleetSample], records: Sequence[RequestRecord], engines: Mapping[str, tuple[int, str]]
) -> list[Sample]:
    """The simulator's periodic samples at each etcd sample: GPUs of engines with a request in flight
    (from the records: sent, not finished, served by that engine) and requests in the system."""
    out = []
    for s in samples:
        busy: set[str] = set()
        inside = 0
        for r in records:
            end = r.finish_s if r.finish_s is not None else r.arrival_s
            if r.arrival_s <= s.t < end:
                inside += 1
                if r.instance:
                    busy.add(r.instance)
        active = sum(engines.get(e, (1, ""))[0] for e in busy)
        out.append(Sample(s.t, 0, 0, active, inside))
    return out


def live_report(
    outcomes: Sequence[LiveOutcome],
    samples: Sequence[FleetSample],
    services: Sequence[SimService],
    *,
    solo: SoloTimes | None = None,
    names: Mapping[str, str] | None = None,
    migration: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | None = None,
    wall_s: float = 0.0,
    extra: Mapping[str, Any] | None = None,
) -> LiveRun:
    """One run of the ``llmfleet sim`` report (``runs[i]``): ``overall``, ``services``, ``cluster``,
    ``cost_models``, ``placement`` (when a plan was written during the run), ``migration`` (when given),
    ``policy``, ``plan`` (the plan in force at the start) and ``live`` (send lag, samples, via); with
    the requests' rows, from the same records."""
    engines = _engines(samples)
    records = records_of(outcomes, services, engines, solo)
    log = gpu_log(samples)
    decisions = placement_decisions(samples, names)
    done = [r.finish_s for r in records if r.finish_s is not None]
    result = SimResult(
        records=records,
        samples=cluster_samples(samples, records, engines),
        instances=[
            {"instance_id": e, "tp": tp, "hardware": hw, "busy_s": 0.0, "iterations": 0, "adapter_loads": 0}
            for e, (tp, hw) in sorted(engines.items())
        ],
        end_s=max(done, default=0.0),
        events=0,
        wall_s=wall_s,
        cost_sources=solo.sources() if solo is not None else {},
        provisioned_gpus=max((n for _, n in log), default=0),
        gpu_log=log,
        placement=decisions,
    )
    report = summarize(result, services)
    if solo is not None:
        report["cost_source"] = solo.cost_source
        report["normalized_reference"] = solo.references()
    cluster = report["cluster"]
    for key in UNOBSERVED:
        cluster[key] = None
    if not any(r.solo_s > 0 for r in records):  # no cost model: SeaLLM's objective is not measurable
        for part in (report["overall"], *report["services"].values()):
            part["slo"]["seallm"] = None
    cluster["peak_gpus_in_use"] = max((n for _, n in log), default=0)
    cluster["gpus_total"] = max((s.gpus_total for s in samples), default=0)
    hw = sorted({h for _, h in engines.values() if h})
    cluster["spec"] = f"{cluster['gpus_total']}x{'/'.join(hw) or '?'} (live)"
    if migration is not None:
        report["migration"] = dict(migration)
    report["policy"] = {"name": "live", **(policy or {})}
    report["plan"] = [dataclasses.asdict(p) for p in (samples[0].plan(names) if samples else [])]
    sent = [o for o in outcomes]
    timed = [o for o in outcomes if o.ok and o.engine_ttft_s is not None]
    report["live"] = {
        "sent": len(sent),
        "send_lag_s": dist([max(0.0, o.arrival_s - o.planned_s) for o in sent]),
        # the engines' own TTFT (what the simulator models: it hands a request to its engine at arrival)
        # and what the path outside them added (client TTFT minus the engine's), per request
        "engine_ttft_s": dist([o.engine_ttft_s or 0.0 for o in timed]),
        "path_ttft_s": dist([(o.first_s or 0.0) - o.arrival_s - (o.engine_ttft_s or 0.0) for o in timed]),
        "path_parts_s": _path_parts([o for o in timed if o.scheduler_ttft_s is not None]),
        "samples": len(samples),
        "errors": _count(o.error for o in outcomes if not o.ok),
        "finish_reasons": _count(o.finish_reason for o in outcomes if o.ok),
        "short_outputs": sum(1 for o in outcomes if o.ok and o.completion_tokens < o.max_tokens),
        "engines": _count(o.engine_id for o in outcomes if o.ok and o.engine_id),  # served by (the last one)
        **(extra or {}),
    }
    return LiveRun(report, live_rows(outcomes, records))


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x or "?"] = out.get(x or "?", 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _path_parts(outcomes: list[LiveOutcome]) -> dict[str, dict[str, float]]:
    """Per request, the path outside the engine in three parts that add up to it: client to scheduler
    and back (client TTFT minus the scheduler's), the scheduler choosing an engine (its queue time), and
    scheduler to engine and back (the scheduler's TTFT after dispatch minus the engine's own)."""
    client, dispatch, engine = [], [], []
    for o in outcomes:
        sched, queue = o.scheduler_ttft_s or 0.0, o.scheduler_queue_s or 0.0
        client.append((o.first_s or 0.0) - o.arrival_s - sched)
        dispatch.append(queue)
        engine.append(sched - queue - (o.engine_ttft_s or 0.0))
    return {
        "client_scheduler": dist(client),
        "scheduler_dispatch": dist(dispatch),
        "scheduler_engine": dist(engine),
    }
