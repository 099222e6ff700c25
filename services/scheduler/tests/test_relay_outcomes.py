"""Relay against fake engines (in-process gRPC servers): every end of a placement — finished, failed,
failed over, cancelled, migrated away — releases it in the load book and reaches the dispatch policy's
``on_finish``; a policy that cannot run here fails the request with a clear status."""

from __future__ import annotations

import asyncio
import contextlib
import re

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.metrics.server import samples
from llmfleet.policies.dispatch import DispatchNeeds, FinishListener, NoCandidate
from llmfleet.rpc.mux import GENERATE_MANY, from_servicer, serve_many
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord
from llmfleet_scheduler.capacity import CapacityGate
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.engine_links import EngineLinks
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.observe import ObservationBatcher
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter
from prometheus_client import CollectorRegistry, generate_latest

M = "m"


class FakeEngine(engine_pb2_grpc.EngineServicer):
    """Behaviour by prompt: ``ok`` (2 tokens, length), ``bad`` (INVALID_ARGUMENT), ``down``
    (UNAVAILABLE on this engine only), ``migrate`` (1 token, then migrated to ``self.peer``),
    ``hang`` (1 token, then nothing)."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.peer = ""
        self.down = False
        self.seen: list[str] = []

    async def GenerateMany(self, request_iterator, context):
        async for batch in serve_many(request_iterator, from_servicer(self.Generate), method=GENERATE_MANY):
            yield batch

    async def Generate(self, request, context):
        self.seen.append(request.request_id)
        prompt = request.prompt
        if prompt == "bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad prompt")
        if prompt == "down" and self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "engine going away")
        start = len(request.resume_token_ids)
        yield common_pb2.TokenChunk(request_id=request.request_id, index=start, token_ids=[7])
        if prompt == "migrate" and self.peer:
            yield common_pb2.TokenChunk(
                request_id=request.request_id,
                index=start + 1,
                finish_reason=common_pb2.FINISH_REASON_MIGRATED,
                migrated_to=self.peer,
            )
            return
        if prompt == "hang":
            await asyncio.sleep(3600)
        yield common_pb2.TokenChunk(
            request_id=request.request_id,
            index=start + 1,
            token_ids=[8],
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            engine_id=self.engine_id,
            usage=common_pb2.Usage(prompt_tokens=50 if prompt == "ok" else 0),  # counts an ok prompt as 50
        )


class Recorder(FinishListener):
    """First eligible engine by id; records every on_finish."""

    name = "recorder"
    needs = DispatchNeeds()

    def __init__(self) -> None:
        self.finished: list[tuple[str, str, int]] = []
        self.prompt_tokens: list[int] = []  # what each dispatch was told of the prompt

    def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
        self.prompt_tokens.append(request.prompt_tokens)
        ids = sorted(c.engine_id for c in candidates if model in c.models and c.engine_id not in exclude)
        if not ids:
            raise NoCandidate(f"no engine for {model!r}")
        return ids[0]

    def on_finish(self, request_id, engine_id, output_tokens, now) -> None:
        self.finished.append((request_id, engine_id, output_tokens))


def relay_of(directory, router, metrics: SchedulerMetrics | None = None, **options) -> Relay:
    """The relay as the scheduler assembles it (its gate with cold starts off: an unhosted model fails)."""
    m = metrics or SchedulerMetrics(CollectorRegistry())
    gate = CapacityGate(directory, cold_start=False, metrics=m)
    return Relay(directory, router, EngineLinks(directory), gate, ObservationBatcher(directory), m, **options)


class FixedRouter(DispatchRouter):
    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy

    def for_service(self, spec):
        return self.policy

    def policies(self):
        return [self.policy]


@pytest.fixture
async def cluster():
    fakes = {e: FakeEngine(e) for e in ("e0", "e1")}
    servers = {}
    for e, fake in fakes.items():
        servers[e] = await GrpcServer(
            [(engine_pb2_grpc.add_EngineServicer_to_server, fake, service_name(engine_pb2, "Engine"))]
        ).start()
    fakes["e0"].peer = servers["e1"].address
    nodes = {e: NodeRecord(e, ENGINE_ROLE, s.address, models=(M,)) for e, s in servers.items()}
    directory = ClusterDirectory(StaticView({"s": ServiceSpec("s", M)}), StaticView(nodes))
    policy = Recorder()
    relay = relay_of(directory, FixedRouter(policy), predict_mode="never")
    try:
        yield fakes, directory, policy, relay
    finally:
        await directory.close()
        for s in servers.values():
            await s.stop(0)


def start(relay: Relay, rid: str, prompt: str) -> tuple[RequestRecord, asyncio.Task]:
    rec = RequestRecord(request_id=rid, service="s", model=M, fingerprint=b"")
    req = engine_pb2.GenerateRequest(request_id=rid, model=M, prompt=prompt, service="s")
    rec.driver = asyncio.create_task(relay.run(rec, req, None))
    return rec, rec.driver


async def test_finished(cluster):
    _, directory, policy, relay = cluster
    rec, task = start(relay, "r-ok", "ok")
    await task
    assert rec.final.finish_reason == common_pb2.FINISH_REASON_LENGTH and rec.n_tokens == 2
    assert policy.finished == [("r-ok", "e0", 2)]
    assert directory.load.pending("e0") == 0


async def test_dispatch_is_told_the_records_prompt_estimate(cluster):
    _, _, policy, relay = cluster
    rec = RequestRecord(request_id="r-est", service="s", model=M, fingerprint=b"", prompt_estimate=123)
    req = engine_pb2.GenerateRequest(request_id="r-est", model=M, prompt="ok", service="s")
    await relay.run(rec, req, None)
    assert policy.prompt_tokens == [123]  # the servicer's estimate, not the prompt counted again


async def test_failed(cluster):
    _, directory, policy, relay = cluster
    rec, task = start(relay, "r-bad", "bad")
    await task
    assert rec.error is not None and rec.error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert policy.finished == [("r-bad", "e0", 0)]
    assert directory.load.pending("e0") == 0


async def test_failed_over_then_finished(cluster):
    fakes, directory, policy, relay = cluster
    fakes["e0"].down = True
    rec, task = start(relay, "r-down", "down")
    await task
    assert rec.final is not None and rec.engines == ["e0", "e1"]
    assert policy.finished == [("r-down", "e0", 0), ("r-down", "e1", 2)]
    assert directory.load.pending("e0") == directory.load.pending("e1") == 0


async def test_migrated_away_then_finished(cluster):
    fakes, directory, policy, relay = cluster
    rec, task = start(relay, "r-mig", "migrate")
    await task
    assert rec.final is not None and rec.engines == ["e0", "e1"] and rec.n_tokens == 3  # 1 on e0, 2 on e1
    assert fakes["e1"].seen == ["r-mig"]
    assert policy.finished == [("r-mig", "e0", 1), ("r-mig", "e1", 3)]
    assert directory.load.pending("e0") == directory.load.pending("e1") == 0


async def test_cancelled(cluster):
    _, directory, policy, relay = cluster
    rec, task = start(relay, "r-hang", "hang")
    for _ in range(500):
        if rec.n_tokens:
            break
        await asyncio.sleep(0.01)
    assert rec.n_tokens == 1
    assert directory.load.pending("e0") == 1  # counted on e0 while it runs there
    assert directory.candidates()[0].queued == 1
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert rec.final.finish_reason == common_pb2.FINISH_REASON_CANCELLED
    assert policy.finished == [("r-hang", "e0", 1)]
    assert directory.load.pending("e0") == 0


class ProgressReader(Recorder):
    """Reads per-request progress (as Aladdin's constraint (d) does): records what each choice saw."""

    needs = DispatchNeeds(reads_progress=True)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, tuple | None]] = []

    def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
        self.seen.append({c.engine_id: c.requests for c in candidates})
        return super().choose(model, candidates, exclude, request)


async def test_relayed_tokens_are_the_progress_a_policy_reads(cluster):
    """The relay measures each request's tokens and first-token time (the scheduler's monotonic clock,
    the one its dispatch times use) and the candidates carry them while the placement lasts."""
    _, directory, _, _ = cluster
    policy = ProgressReader()
    relay = relay_of(directory, FixedRouter(policy), predict_mode="never")
    rec, task = start(relay, "r-hang", "hang")
    for _ in range(500):
        if rec.n_tokens:
            break
        await asyncio.sleep(0.01)
    assert rec.n_tokens == 1
    assert policy.seen == [{"e0": (), "e1": ()}]  # nothing decoding yet
    _, t2 = start(relay, "r-ok", "ok")
    await t2
    (q,) = policy.seen[1]["e0"]
    assert (q.request_id, q.model, q.generated_tokens, q.first_token_s) == (
        "r-hang",
        M,
        1,
        rec.first_token_at,
    )
    assert policy.seen[1]["e1"] == ()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert directory.candidates(progress=True)[0].requests == ()  # released with the placement
    assert directory.candidates()[0].requests is None


async def test_a_policy_that_cannot_run_here_fails_the_request_clearly(cluster):
    _, directory, _, _ = cluster
    relay = relay_of(directory, DispatchRouter("jsq", load_source=False), predict_mode="never")
    rec, task = start(relay, "r-jsq", "ok")
    await task
    assert rec.error is not None and rec.error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "dispatch policy 'jsq' reads engine load (queue lengths)" in rec.error.details


async def test_the_dispatch_policy_sees_the_prompt_text(cluster):
    _, directory, _, _ = cluster

    class PromptReader(Recorder):
        needs = DispatchNeeds(reads_prompt=True)

        def __init__(self) -> None:
            super().__init__()
            self.prompts: list[str] = []

        def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
            self.prompts.append(request.prompt)
            return super().choose(model, candidates, exclude, request)

    reader = PromptReader()
    relay = relay_of(directory, FixedRouter(reader), predict_mode="never")
    rec, task = start(relay, "r-prompt", "ok")
    await task
    assert rec.error is None and reader.prompts == ["ok"]


# ------------------------------------------------------------------ llmfleet_scheduler_* metrics


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    return samples(registry)


@pytest.fixture
def metered(cluster):
    fakes, directory, _policy, _relay = cluster
    registry = CollectorRegistry()
    relay = relay_of(directory, FixedRouter(Recorder()), SchedulerMetrics(registry), predict_mode="never")
    return fakes, relay, registry


async def test_scheduler_counts_outcomes_dispatches_and_latency(metered) -> None:
    fakes, relay, registry = metered
    for rid, prompt in (("a", "ok"), ("b", "ok"), ("c", "bad")):
        _, task = start(relay, rid, prompt)
        await task
    fakes["e0"].down = True
    _, task = start(relay, "d", "down")  # fails over from e0 to e1
    await task
    s = _samples(registry)
    assert s['llmfleet_scheduler_requests_total{model="m",outcome="length",service="s"}'] == 3
    assert s['llmfleet_scheduler_requests_total{model="m",outcome="failed",service="s"}'] == 1
    assert s['llmfleet_scheduler_dispatch_total{engine="e0",service="s"}'] == 4
    assert s['llmfleet_scheduler_dispatch_total{engine="e1",service="s"}'] == 1
    assert s['llmfleet_scheduler_ttft_seconds_count{service="s"}'] == 3
    assert s['llmfleet_scheduler_tpot_seconds_count{service="s"}'] == 3  # 2 tokens each
    assert s["llmfleet_scheduler_requests_in_flight"] == 0
    names = set(re.findall(r"^# TYPE (\S+) ", generate_latest(registry).decode(), re.M))
    assert all(n.startswith("llmfleet_") for n in names)


# ---- Aladdin's Algorithm 2 live (rebalance.py) ------------------------------------------------------


class MovingEngine(FakeEngine):
    """``queued`` waits without a token until a Migrate moves it to the peer (a request not started)."""

    def __init__(self, engine_id: str) -> None:
        super().__init__(engine_id)
        self.migrates: list[engine_pb2.MigrateRequest] = []
        self._moved: dict[str, asyncio.Event] = {}

    async def Generate(self, request, context):
        if request.prompt != "queued" or request.resume_token_ids or not self.peer:
            async for c in super().Generate(request, context):
                yield c
            return
        self.seen.append(request.request_id)
        ev = self._moved.setdefault(request.request_id, asyncio.Event())
        await ev.wait()
        yield common_pb2.TokenChunk(
            request_id=request.request_id,
            index=0,
            finish_reason=common_pb2.FINISH_REASON_MIGRATED,
            migrated_to=self.peer,
        )

    async def Migrate(self, request, context):
        self.migrates.append(request)
        ev = self._moved.get(request.request_id)
        if ev is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "not here")
        ev.set()
        return engine_pb2.MigrateResponse(mode=request.mode)


class Planner(Recorder):
    """A Rebalancer that plans one move per request it is told to, and records apply_move."""

    def __init__(self) -> None:
        super().__init__()
        self.plan: list[tuple[str, str, str]] = []
        self.applied: list[tuple[str, str]] = []

    def rebalance(self, now):
        plan, self.plan = self.plan, []
        return plan

    def apply_move(self, request_id, to_engine, now):
        self.applied.append((request_id, to_engine))


async def test_rebalance_moves_a_request_not_started_and_records_a_move():
    from llmfleet_scheduler.rebalance import LiveRebalance

    fakes = {e: MovingEngine(e) for e in ("e0", "e1")}
    servers = {
        e: await GrpcServer(
            [(engine_pb2_grpc.add_EngineServicer_to_server, f, service_name(engine_pb2, "Engine"))]
        ).start()
        for e, f in fakes.items()
    }
    fakes["e0"].peer = servers["e1"].address
    nodes = {e: NodeRecord(e, ENGINE_ROLE, s.address, models=(M,)) for e, s in servers.items()}
    directory = ClusterDirectory(StaticView({"s": ServiceSpec("s", M)}), StaticView(nodes))
    policy = Planner()
    router = FixedRouter(policy)
    relay = relay_of(directory, router, predict_mode="never")
    started: set[str] = set()
    rebalance = LiveRebalance(router, relay, directory, lambda rid: rid in started)
    try:
        rec, task = start(relay, "r-q", "queued")
        for _ in range(500):
            if fakes["e0"].seen:
                break
            await asyncio.sleep(0.01)
        started.add("r-other")
        policy.plan = [("r-q", "e0", "e1"), ("r-other", "e0", "e1"), ("r-x", "e0", "nowhere")]
        assert await rebalance.tick() == 1
        await task
        assert rec.final is not None and rec.engines == ["e0", "e1"] and rec.n_tokens == 2
        (m,) = fakes["e0"].migrates
        assert m.request_id == "r-q" and m.destination == servers["e1"].address
        assert m.mode == engine_pb2.MIGRATE_MODE_TOKENS
        assert policy.applied == [("r-q", "e1")]
        assert policy.finished == [("r-q", "e1", 2)]  # the move is no end at e0
        assert (rebalance.stats.moved, rebalance.stats.skipped) == (1, 2) and not relay.planned_moves
    finally:
        await directory.close()
        for s in servers.values():
            await s.stop(0)


class Overflowing(Recorder):
    """Counts a request as infeasible (``CountsInfeasible``) when its prompt says so, as best fit does
    when no worker can take it and it falls back to the least loaded one."""

    def __init__(self) -> None:
        super().__init__()
        self.infeasible = 0

    def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
        if request is not None and request.request_id.startswith("r-full"):
            self.infeasible += 1
        return super().choose(model, candidates, exclude, request)


class Heard:
    def __init__(self) -> None:
        self.heard: dict[str, list[str]] = {"arrived": [], "finished": [], "infeasible": []}

    def arrived(self, rec):
        self.heard["arrived"].append(rec.request_id)

    def finished(self, rec):
        self.heard["finished"].append(rec.request_id)

    def infeasible(self, rec):
        self.heard["infeasible"].append(rec.request_id)


async def test_the_service_monitor_hears_each_request_dispatch_counted_infeasible(cluster):
    """The relay tells the stats listener about a request exactly when the policy's infeasible count
    rose while choosing for it (the live half of Aladdin's scale-out signal)."""
    from llmfleet.policies.dispatch import CountsInfeasible

    _, directory, _, _ = cluster
    policy, heard = Overflowing(), Heard()
    assert isinstance(policy, CountsInfeasible)
    relay = relay_of(directory, FixedRouter(policy), predict_mode="never", stats=heard)
    for rid in ("r-ok-1", "r-full-1", "r-ok-2", "r-full-2"):
        _, task = start(relay, rid, "ok")
        await task
    assert heard.heard["infeasible"] == ["r-full-1", "r-full-2"] and policy.infeasible == 2
    assert heard.heard["arrived"] == heard.heard["finished"] == ["r-ok-1", "r-full-1", "r-ok-2", "r-full-2"]


async def test_the_first_engines_count_of_a_whole_prompt_scales_the_models_estimate(metered):
    _, relay, registry = metered
    rec = RequestRecord(
        request_id="r-c", service="s", model=M, fingerprint=b"", prompt_estimate=100, prompt_raw=100
    )
    await relay.run(
        rec, engine_pb2.GenerateRequest(request_id="r-c", model=M, prompt="ok", service="s"), None
    )
    assert rec.prompt_tokens == 50 and relay.prompt_tokens.scale(M) == 0.5
    assert relay.prompt_tokens.estimate(M, 300) == 150  # the next request of the model
    # a resumed request's count holds its resumed tokens too: it does not calibrate
    resumed = RequestRecord(
        request_id="r-r",
        service="s",
        model=M,
        fingerprint=b"",
        prompt_raw=25,
        prefix_token_ids=(7,),
        n_tokens=1,
    )
    req = engine_pb2.GenerateRequest(
        request_id="r-r", model=M, prompt="ok", service="s", resume_token_ids=[7]
    )
    await relay.run(resumed, req, None)
    assert resumed.prompt_tokens == 50 and relay.prompt_tokens.scale(M) == 0.5
    assert _samples(registry)['llmfleet_scheduler_prompt_token_scale{model="m"}'] == 0.5
