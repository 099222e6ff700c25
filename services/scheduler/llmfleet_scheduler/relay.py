"""Drive one request: pick an engine with the dispatch policy, relay its token stream into the
journal, and fail over to another engine (resuming from the delivered tokens) if it dies."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from llmfleet.api.v1 import common_pb2, engine_pb2, profiler_pb2
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.policies.capacity import Unplaceable
from llmfleet.policies.dispatch import (
    CountsInfeasible,
    DispatchRequest,
    FinishListener,
    NoCandidate,
    Rebalancer,
)
from llmfleet.rpc.mux import MuxStream
from llmfleet.spec.services import ServiceSpec
from llmfleet.token_estimate import PromptTokens

from llmfleet_scheduler.capacity import CapacityGate, ColdStartTimeout
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.engine_links import EngineLinks
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.observe import ObservationBatcher
from llmfleet_scheduler.routing import DispatchRouter, PredictionBatcher
from llmfleet_scheduler.scls_central import MODE as SCLS_CENTRAL
from llmfleet_scheduler.scls_central import Assignment, SclsCentral

log = logging.getLogger(__name__)

# Engine failures after which the request moves to another engine; anything else is the answer.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN}
# Only naturally finished requests teach the length predictor (a cancelled one is truncated).
COMPLETED = {common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_EOS}


class RequestListener(Protocol):
    """Hears every request the relay runs: once when it starts, once when it ends (any outcome)."""

    def arrived(self, rec: RequestRecord) -> None: ...

    def finished(self, rec: RequestRecord) -> None: ...

    def infeasible(self, rec: RequestRecord) -> None:
        """Dispatch found no feasible worker for ``rec`` (a ``CountsInfeasible`` policy counted it)."""
        ...


@dataclass
class Relay:
    directory: ClusterDirectory
    router: DispatchRouter
    links: EngineLinks  # one multiplexed GenerateMany call per engine: every request's stream rides it
    # where requests wait for capacity (scale from zero, late binding; with cold starts off, a model no
    # engine hosts fails at once)
    gate: CapacityGate
    observations: ObservationBatcher  # completed requests -> profiler (batched)
    metrics: SchedulerMetrics  # llmfleet_scheduler_*
    predictions: PredictionBatcher | None = None
    predict_mode: str = "auto"  # always | auto | never (see DispatchRouter.wants_prediction)
    max_attempts: int = 3
    max_migrations: int = 16
    stats: RequestListener | None = None  # arrivals and ends -> the service monitor (stats_reporter)
    central: SclsCentral | None = None  # services with dispatch scls_central (None: refused)
    # engine id -> its open streams: cut when the engine leaves etcd (lease gone), so requests fail
    # over within one lease TTL instead of when TCP gives up on a silent host
    _open: dict[str, set[MuxStream]] = field(default_factory=dict)
    _cut: set[int] = field(default_factory=set)  # id() of calls cut that way
    # request id -> engine a dispatch policy's rebalance is moving it to (see rebalance.py)
    planned_moves: dict[str, str] = field(default_factory=dict)
    # the prompt-token estimate, scaled per model by the engines' counts (each request's first count)
    prompt_tokens: PromptTokens = field(default_factory=PromptTokens)

    async def run(self, rec: RequestRecord, req: engine_pb2.GenerateRequest, deadline: float | None) -> None:
        """Run ``req`` to completion into ``rec``; every outcome ends in rec.finish or rec.fail."""
        if self.stats is not None:
            self.stats.arrived(rec)
        self.metrics.arrived()
        try:
            await self._dispatch(rec, req, deadline)
        except asyncio.CancelledError:
            await rec.finish(rec.final_chunk(common_pb2.FINISH_REASON_CANCELLED))
            raise
        except Exception as e:  # never leave a request hanging
            log.exception("request %s failed", rec.request_id)
            await rec.fail(grpc.StatusCode.INTERNAL, f"scheduler error: {e}")
        finally:
            if self.stats is not None:
                self.stats.finished(rec)
            self._count(self.metrics, rec)
        if rec.final is not None and rec.final.finish_reason in COMPLETED:
            self._observe(rec)

    async def _dispatch(
        self, rec: RequestRecord, req: engine_pb2.GenerateRequest, deadline: float | None
    ) -> None:
        excluded: set[str] = set()
        last_error = ""
        spec = self.directory.services().get(rec.service) or ServiceSpec(rec.service, rec.model)
        if spec.dispatch is not None and spec.dispatch.policy == SCLS_CENTRAL:
            if self.central is None:
                await rec.fail(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"service {rec.service!r}: {SCLS_CENTRAL} is off here",
                )
                return
            await self._central_slices(rec, req, deadline)
            return
        try:
            policy = self.router.for_service(spec)
        except (ValueError, KeyError) as e:  # a policy that cannot be built or cannot run here
            why = e.args[0] if e.args else e
            await rec.fail(grpc.StatusCode.FAILED_PRECONDITION, f"service {rec.service!r}: {why}")
            return
        listener = policy if _is(policy, FinishListener) else None
        counts = _is(policy, CountsInfeasible)
        predicted = None
        if self.predictions is not None and self.router.wants_prediction(spec, self.predict_mode):
            predicted = await self.predictions.predict(rec.request_id, rec.service, req.prompt)
            if predicted:
                req.predicted_output_tokens = predicted
        # the scheduler does not tokenize: the prompt length is estimated (llmfleet.token_estimate);
        # the prompt text and the conversation go along for policies that read them (prefix_affinity)
        dreq = DispatchRequest(
            rec.request_id, rec.model, rec.service, rec.prompt_estimate, predicted or 0.0,
            int(self.directory.load.kv_bytes_per_token(rec.model)), rec.arrival, prompt=req.prompt,
            session=rec.session, base=self.directory.base_of(rec.model),
        )  # fmt: skip
        for _ in range(self.max_attempts):
            counted = policy.infeasible if counts else 0
            try:
                engine_id = await self.gate.place(spec, policy, dreq, frozenset(excluded))
            except NoCandidate as e:
                why = f"{e}" + (f"; last engine error: {last_error}" if last_error else "")
                await rec.fail(grpc.StatusCode.UNAVAILABLE, f"service {rec.service!r}: {why}")
                return
            except Unplaceable as e:
                await rec.fail(grpc.StatusCode.FAILED_PRECONDITION, f"service {rec.service!r}: {e}")
                return
            except ColdStartTimeout as e:
                await rec.fail(grpc.StatusCode.UNAVAILABLE, f"service {rec.service!r}: {e}", e.retry_after_s)
                return
            if self.stats is not None and counts and policy.infeasible != counted:
                self.stats.infeasible(rec)
            node = self.directory.engines().get(engine_id)
            if node is None:
                excluded.add(engine_id)
                continue
            if rec.dispatched_at is None:
                rec.dispatched_at = time.monotonic()
            self.metrics.dispatched(rec.service, engine_id)
            try:
                await self._follow(rec, req, engine_id, node.address, deadline, dreq, listener)
                return
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    await rec.fail(e.code(), f"deadline exceeded after {rec.n_tokens} tokens")
                    return
                if e.code() not in RETRYABLE:
                    await rec.fail(e.code(), e.details() or str(e.code()))
                    return
                last_error = f"{engine_id}: {e.code().name}: {e.details()}"
                log.warning(
                    "request %s: engine %s failed (%s); failing over", rec.request_id, engine_id, last_error
                )
                excluded.add(engine_id)
        await rec.fail(
            grpc.StatusCode.UNAVAILABLE, f"service {rec.service!r}: all attempts failed; {last_error}"
        )

    async def _follow(
        self,
        rec: RequestRecord,
        req: engine_pb2.GenerateRequest,
        engine_id: str,
        address: str,
        deadline: float | None,
        dreq: DispatchRequest,
        listener: FinishListener | None,
    ) -> None:
        """Stream from ``address``; when the engine migrates the request, follow it to the destination
        (the destination recognises the request id and continues the same stream). Each engine's part
        is a placement: counted in the load book while it lasts, and when it ends — finished, failed,
        cancelled or migrated away — released there and told to the policy (``listener``)."""
        for _ in range(self.max_migrations):
            rec.engines.append(engine_id)
            del req.resume_token_ids[:]
            req.resume_token_ids.extend(rec.delivered_token_ids())
            timeout = None if deadline is None else max(0.001, deadline - time.monotonic())
            # KV estimate: what the request holds once prefilled (prompt tokens x bytes per token)
            kv = dreq.prompt_tokens * dreq.kv_bytes_per_token
            self.directory.load.dispatched(engine_id, rec.request_id, kv)
            moved_to = None
            try:
                moved_to = await self._stream(rec, req, engine_id, address, timeout)
            finally:
                self.directory.load.released(engine_id, rec.request_id)
                self.gate.notify()  # room on that engine: a held request may go
                planned = self.planned_moves.pop(rec.request_id, None)
                if listener is not None and not (
                    moved_to is not None and planned is not None and self._moved(listener, rec, planned)
                ):
                    listener.on_finish(rec.request_id, engine_id, rec.n_tokens, time.monotonic())
            if moved_to is None:
                return
            log.info("request %s migrated from %s to %s", rec.request_id, engine_id, moved_to)
            address = moved_to
            engine_id = self.directory.engine_at(moved_to) or moved_to
        await rec.fail(grpc.StatusCode.ABORTED, f"request migrated more than {self.max_migrations} times")

    async def _stream(
        self,
        rec: RequestRecord,
        req: engine_pb2.GenerateRequest,
        engine_id: str,
        address: str,
        timeout: float | None,
    ) -> str | None:
        """Relay one engine stream into the journal; returns the destination if the request migrated."""
        final = await self._relay_stream(rec, req, address, timeout, engine_id)
        if len(rec.engines) == 1:
            if not rec.engine_ttft_s and final.usage.ttft_s:
                rec.engine_ttft_s = final.usage.ttft_s
            rec.cached_tokens = final.usage.cached_tokens
        if final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to:
            return final.migrated_to
        await rec.finish(rec.final_chunk(final.finish_reason, engine_id))
        return None

    async def _relay_stream(
        self,
        rec: RequestRecord,
        req: engine_pb2.GenerateRequest,
        address: str,
        timeout: float | None,
        engine_id: str | None = None,
    ) -> common_pb2.TokenChunk:
        """Relay one engine stream's tokens into the journal; returns its final chunk (not applied).
        With ``engine_id`` (a dispatched placement) the load book hears the request's progress."""
        take = self._taker(rec, engine_id)
        call = self.links.open(address, req, timeout)
        call.on_chunk = take  # tokens go to the journal as they arrive, no wake-up per token
        final: common_pb2.TokenChunk | None = None
        owner = engine_id or self.directory.engine_at(address)
        if owner is not None:
            self._open.setdefault(owner, set()).add(call)
        try:
            # Read to the end of the stream (not just the final chunk) so the call, and its client
            # span, complete normally.
            async for chunk in call:
                if chunk.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
                    take(chunk)
                    continue
                if chunk.usage.prompt_tokens:
                    self._counted(rec, chunk.usage.prompt_tokens)
                final = chunk
                tail = common_pb2.TokenChunk()
                tail.CopyFrom(chunk)
                tail.ClearField("finish_reason")
                tail.ClearField("usage")
                await rec.append(tail)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if id(call) in self._cut and not (task is not None and task.cancelling()):
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    f"engine {owner} left the cluster (its lease is gone)",
                ) from None
            raise
        finally:
            call.cancel()  # no-op when finished; frees the engine's work when we are cancelled
            self._cut.discard(id(call))
            if owner is not None and (open_ := self._open.get(owner)) is not None:
                open_.discard(call)
                if not open_:
                    self._open.pop(owner, None)
        if final is None:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "stream ended without a final chunk",
            )
        return final

    def _counted(self, rec: RequestRecord, tokens: int) -> None:
        """An engine counted ``rec``'s prompt tokens; the first engine's count of a prompt sent whole
        (no resumed tokens) calibrates the estimate for its model."""
        if not rec.prompt_tokens and not rec.prefix_token_ids and len(rec.engines) == 1:
            self.prompt_tokens.observe(rec.model, rec.prompt_raw, tokens)
            self.metrics.prompt_token_scale.labels(rec.model).set(self.prompt_tokens.scale(rec.model))
        rec.prompt_tokens = tokens

    def _taker(self, rec: RequestRecord, engine_id: str | None) -> Callable[[common_pb2.TokenChunk], None]:
        """What ``_relay_stream`` does with each chunk before the final one (a callback on the
        multiplexed path): into the journal, and the load book hears the request's progress."""
        load = self.directory.load

        def take(chunk: common_pb2.TokenChunk) -> None:
            if chunk.usage.prompt_tokens:
                self._counted(rec, chunk.usage.prompt_tokens)
            rec.add(chunk)
            if engine_id is not None and rec.first_token_at is not None:  # Aladdin's (d)
                load.progress(engine_id, rec.request_id, rec.model, rec.n_tokens, rec.first_token_at)

        return take

    async def _central_slices(
        self, rec: RequestRecord, req: engine_pb2.GenerateRequest, deadline: float | None
    ) -> None:
        """SCLS central scheduling: slices from the central driver (``scls_central.py``) until the request
        is done. Each waits in the pool for a batch, then runs on the engine the batch went to; an engine
        failure sends the request back to the pool (its tokens so far are kept).

        Not folded into :meth:`_dispatch`: a central request is dispatched once per slice, from a pool the
        driver resolves every interval, not placed by a policy through the capacity gate; its failures go
        back to the pool instead of excluding the engine, and its slices are not in the load book."""
        central = self.central
        assert central is not None
        total = req.sampling.max_tokens
        failures = 0
        while True:
            prompt = rec.prompt_tokens or rec.prompt_estimate
            a = await central.next_slice(
                rec.request_id, rec.service, rec.model, rec.arrival, prompt + rec.n_tokens
            )
            try:
                out = await self._slice(rec, req, a, total, deadline)
            finally:
                central.returned(a)
            if out is None:  # failed for good
                return
            if isinstance(out, str):  # the engine failed: back to the pool
                failures += 1
                if failures >= self.max_attempts:
                    await rec.fail(grpc.StatusCode.UNAVAILABLE, f"service {rec.service!r}: {out}")
                    return
                log.warning(
                    "request %s: slice on %s failed (%s); back to the pool", rec.request_id, a.engine_id, out
                )
                continue
            if not central.unfinished(out.finish_reason, rec.n_tokens, total):
                await rec.finish(rec.final_chunk(out.finish_reason, a.engine_id))
                return

    async def _slice(
        self,
        rec: RequestRecord,
        req: engine_pb2.GenerateRequest,
        a: Assignment,
        total: int,
        deadline: float | None,
    ) -> common_pb2.TokenChunk | str | None:
        """Run one slice of ``rec`` as batch ``a`` assigned it: its final chunk, or why the engine failed (the
        request may go back to the pool), or None when the request failed for good (``rec.fail`` done)."""
        assert self.central is not None
        node = self.directory.engines().get(a.engine_id)
        if node is None:
            return f"{a.engine_id}: gone"
        slice_req = self.central.slice_request(req, rec.delivered_token_ids(), rec.n_tokens, total, a)
        rec.engines.append(a.engine_id)
        if rec.dispatched_at is None:
            rec.dispatched_at = time.monotonic()
        self.metrics.dispatched(rec.service, a.engine_id)
        timeout = None if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            return await self._relay_stream(rec, slice_req, node.address, timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                await rec.fail(e.code(), f"deadline exceeded after {rec.n_tokens} tokens")
                return None
            if e.code() not in RETRYABLE:
                await rec.fail(e.code(), e.details() or str(e.code()))
                return None
            return f"{a.engine_id}: {e.code().name}: {e.details()}"

    def _moved(self, policy: FinishListener, rec: RequestRecord, to_engine: str) -> bool:
        """A move the policy planned (Aladdin's rebalance) happened: record it as a move, not an end.
        False when the policy cannot (the request started first): then it is told of an end."""
        if not isinstance(policy, Rebalancer):
            return False
        try:
            policy.apply_move(rec.request_id, to_engine, time.monotonic())
        except (KeyError, ValueError) as e:
            log.info("request %s: planned move to %s not applied (%s)", rec.request_id, to_engine, e)
            return False
        return True

    def engine_gone(self, engine_id: str) -> int:
        """``engine_id`` left the cluster: cut its open streams (they fail over); returns how many."""
        calls = self._open.pop(engine_id, set())
        for call in calls:
            self._cut.add(id(call))
            call.cancel()
        if calls:
            log.warning("engine %s left the cluster: failing over %d open stream(s)", engine_id, len(calls))
        return len(calls)

    async def watch_engines(self, grace_s: float = 2.0) -> None:
        """Cut the streams of every engine that leaves ``nodes/`` (its lease expired or it stopped) and
        is still gone ``grace_s`` later: when etcd itself stalls, every lease can expire at once while
        the engines are fine, and they re-register within a second of etcd's return."""
        view = self.directory.nodes_view
        if view is None:
            return
        known: set[str] = set()
        pending: set[asyncio.Task] = set()
        try:
            async for _rev, _nodes in view.subscribe():
                now = set(self.directory.engines())
                for gone in known - now:
                    task = asyncio.create_task(self._cut_if_still_gone(gone, grace_s))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                known = now
        finally:
            for task in pending:
                task.cancel()

    async def _cut_if_still_gone(self, engine_id: str, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        if engine_id not in self.directory.engines():
            self.engine_gone(engine_id)

    @staticmethod
    def _count(metrics: SchedulerMetrics, rec: RequestRecord) -> None:
        """``llmfleet_scheduler_*``: the request's outcome and its TTFT/TPOT as the client saw them."""
        try:
            if rec.error is not None:
                outcome = "failed"
            elif rec.final is not None:
                name = common_pb2.FinishReason.Name(rec.final.finish_reason)
                outcome = name.removeprefix("FINISH_REASON_").lower()
            else:
                outcome = "unknown"
            metrics.finished(
                rec.service, rec.model, outcome, rec.arrival, rec.first_token_at,
                rec.finished_at or time.monotonic(), rec.n_tokens,
            )  # fmt: skip
        except Exception:  # metrics must never fail a request
            log.exception("metrics: counting %s failed", rec.request_id)

    def _observe(self, rec: RequestRecord) -> None:
        """Report a completed request to the profiler (batched: see ``observe.ObservationBatcher``)."""
        if rec.final is None:
            return
        obs = profiler_pb2.Observation(
            request_id=rec.request_id,
            service=rec.service,
            prompt_tokens=rec.prompt_tokens,
            output_tokens=rec.n_tokens,
            latency_s=rec.final.usage.latency_s,
        )
        self.observations.add(obs)


_KINDS: dict[tuple[type, type], bool] = {}


def _is(obj: object, protocol: type) -> bool:
    """``isinstance`` against a runtime-checkable Protocol, cached per class (the Protocol check walks
    every member each time: about 20 µs, on every request)."""
    key = (type(obj), protocol)
    hit = _KINDS.get(key)
    if hit is None:
        hit = _KINDS[key] = isinstance(obj, protocol)
    return hit
