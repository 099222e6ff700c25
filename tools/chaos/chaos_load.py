"""The chaos and soak load: closed-loop streaming workers through the SDK (given both scheduler
replicas) and through the OpenAI-compatible HTTP API (alternating replicas, retrying a cut stream on
the other one), each request recorded as an :class:`~chaos_outcomes.Outcome` and judged against the
uninterrupted greedy output (:func:`compute_reference`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from llmfleet.client import AsyncClient

from tools.chaos.chaos_cluster import SERVICE, ChaosCluster
from tools.chaos.chaos_outcomes import Outcome, Reference, judge

PROMPTS = (
    "Once upon a time there was a tiny model",
    "The fleet keeps going when a node dies",
    "Leases expire and leaders step down",
    "A scheduler replica fails over",
    "Greedy decoding is deterministic",
    "Chaos engineering on two cores",
    "Engines resume from delivered tokens",
    "etcd holds the truth of the cluster",
)
LENGTHS = (8, 16, 32, 64)


async def compute_reference(address: str, lengths: Sequence[int], timeout_s: float = 120) -> Reference:
    """The uninterrupted greedy output of every (prompt, length), one request at a time."""

    ref = Reference()
    async with AsyncClient(address, timeout_s=timeout_s) as c:
        for i, prompt in enumerate(PROMPTS):
            for n in lengths:
                done = await c.complete(prompt, service=SERVICE, max_tokens=n, temperature=0.0)
                ref.token_ids[i, n] = tuple(done.token_ids)
                ref.text[i, n] = done.text
    return ref


def _reason(text: str) -> str:
    """A retry / error message without its request id, pid or address details (for tallies)."""
    text = re.sub(r"[0-9a-f]{16,}", "<id>", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "<addr>", text)
    text = re.sub(r"\d+(\.\d+)?s\b", "<t>", text)
    return text[:160]


class _RetryTally(logging.Handler):
    """Counts the SDK's retry warnings (``llmfleet.client.aio``) by reason, per load phase."""

    def __init__(self, load: Load) -> None:
        super().__init__(logging.WARNING)
        self.load = load

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            msg = record.getMessage()
            if "retry" in msg:
                # "request <id>: scheduler at A unavailable (DETAIL); retry n/N on B in Xs"
                detail = msg.split("(", 1)[-1].rsplit(");", 1)[0] if "(" in msg else msg
                self.load.retry_reasons[self.load.phase]["sdk: " + _reason(detail)] += 1


class Load:
    """Closed-loop streaming workers through the SDK and the HTTP API, recording an :class:`Outcome`
    per request, attributed to ``self.phase`` at its start."""

    def __init__(
        self,
        sdk_addresses: list[str],
        http_addresses: list[str],
        reference: Reference | None,
        *,
        concurrency: int,
        lengths: Sequence[int] = LENGTHS,
        http_share: float = 0.5,
        request_timeout_s: float = 120,
        sdk_retries: int | None = None,
        http_retries: int = 5,
        clients: int | None = None,
        max_requests: int | None = None,
        seed: int = 0,
    ) -> None:
        self.sdk_addresses = sdk_addresses
        self.http_addresses = http_addresses
        self.reference = reference
        self.concurrency = concurrency
        self.lengths = tuple(lengths)
        self.n_http = round(concurrency * http_share)
        self.request_timeout_s = request_timeout_s
        self.sdk_retries = sdk_retries
        self.http_retries = http_retries
        self.clients = clients or concurrency
        self.max_requests = max_requests
        self.rng = random.Random(seed)
        self.phase = 0
        self.outcomes: list[Outcome] = []
        self.token_times: list[float] = []  # when any token reached any client (for stalls)
        self._last_token = 0.0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._sdk: list[Any] = []
        self._http: list[Any] = []
        self._issued = 0
        self.all_done = asyncio.Event()
        self.retry_reasons: dict[int, Counter[str]] = {}
        self._tally = _RetryTally(self)

    @classmethod
    def on(cls, cluster: ChaosCluster, reference: Reference | None, **kwargs: Any) -> Load:
        """A load on ``cluster``: the SDK given both scheduler replicas, HTTP alternating between them."""
        return cls(cluster.sdk_addresses, cluster.http_addresses, reference, **kwargs)

    def set_phase(self, phase: int) -> None:
        self.phase = phase
        self.retry_reasons.setdefault(phase, Counter())

    def _note_token(self) -> None:
        now = time.monotonic()
        if now - self._last_token >= 0.05:  # a coarse trace is enough to find stalls
            self.token_times.append(now)
            self._last_token = now

    def _take(self) -> bool:
        if self.max_requests is not None and self._issued >= self.max_requests:
            return False
        self._issued += 1
        return True

    async def start(self) -> None:
        import aiohttp

        n_sdk = self.concurrency - self.n_http
        self.set_phase(self.phase)
        sdk_log = logging.getLogger("llmfleet.client.aio")
        sdk_log.addHandler(self._tally)
        sdk_log.setLevel(logging.WARNING)
        sdk_log.propagate = False  # tallied, not printed
        kw: dict[str, Any] = {"timeout_s": self.request_timeout_s}
        if self.sdk_retries is not None:
            kw["retries"] = self.sdk_retries
        n_clients = max(1, min(self.clients, max(n_sdk, 1)))
        for i in range(n_clients):  # half the clients prefer each replica
            order = (
                self.sdk_addresses[i % len(self.sdk_addresses) :]
                + self.sdk_addresses[: i % len(self.sdk_addresses)]
            )
            self._sdk.append(AsyncClient(order, **kw))
        # aiohttp, not httpx: httpx's connection pool, not the server, is what thousands of concurrent
        # streams wait for (docs/benchmarks/capacity.md)
        n_http_clients = max(1, min(self.clients, max(self.n_http, 1)))
        self._http = [
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s, connect=5),
            )
            for _ in range(n_http_clients)
        ]
        for w in range(n_sdk):
            self._tasks.append(asyncio.create_task(self._worker("sdk", w)))
        for w in range(self.n_http):
            self._tasks.append(asyncio.create_task(self._worker("http", w)))

    async def stop(self, drain_s: float) -> None:
        """Stop issuing; wait up to ``drain_s`` for open requests (those left are lost)."""
        self._stop.set()
        _, pending = await asyncio.wait(self._tasks, timeout=drain_s) if self._tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for o in self.outcomes:
            if o.status == "running":
                o.status, o.error = "lost", o.error or "no outcome by the end of the drain"
        logging.getLogger("llmfleet.client.aio").removeHandler(self._tally)
        for c in self._sdk:
            await c.close()
        for h in self._http:
            await h.close()

    async def _worker(self, path: str, w: int) -> None:
        rng = random.Random(self.rng.random())
        while not self._stop.is_set() and self._take():
            p = rng.randrange(len(PROMPTS))
            n = rng.choice(self.lengths)
            o = Outcome(path, self.phase, p, n, time.monotonic())
            self.outcomes.append(o)
            try:
                if path == "sdk":
                    await self._sdk_request(self._sdk[w % len(self._sdk)], o)
                else:
                    await self._http_request(self._http[w % len(self._http)], w, o)
            except asyncio.CancelledError:
                o.status, o.error = "lost", o.error or "cancelled at the end of the drain"
                raise
            except Exception as e:
                o.status, o.error = "error", f"{type(e).__name__}: {e}"[:300]
            o.ended = time.monotonic()
        if all(t.done() or t is asyncio.current_task() for t in self._tasks):
            self.all_done.set()

    async def _sdk_request(self, client: Any, o: Outcome) -> None:
        stream = client.generate(PROMPTS[o.prompt], service=SERVICE, max_tokens=o.max_tokens, temperature=0.0)
        tokens: list[int] = []
        index_error = ""
        async with stream:
            async for chunk in stream:
                if chunk.token_ids:
                    if o.ttft_s is None:
                        o.ttft_s = time.monotonic() - o.started
                    self._note_token()
                if chunk.index != len(tokens) and not index_error:
                    index_error = "duplicated" if chunk.index < len(tokens) else "gapped"
                tokens.extend(chunk.token_ids)
        o.retries = max(0, stream.attempts - 1)
        o.tokens = len(tokens)
        if stream.usage is not None:
            o.server_ttft_s, o.server_queue_s = stream.usage.ttft_s, stream.usage.queue_s
        if not stream.finished:
            o.status, o.error = "lost", "the stream ended without its final chunk"
            return
        judge(o, self.reference, tokens, None)
        if index_error and o.status == "ok":
            o.status, o.error = index_error, f"chunk indices {index_error}"

    async def _http_request(self, h: Any, w: int, o: Outcome) -> None:
        body = {
            "model": SERVICE,
            "prompt": PROMPTS[o.prompt],
            "max_tokens": o.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        attempt = 0
        while True:
            base = self.http_addresses[(w + attempt) % len(self.http_addresses)]
            texts: list[str] = []
            usage: dict[str, Any] | None = None
            finished = False
            problem = ""
            retry_after = 0.0
            try:
                async with h.post(f"http://{base}/v1/completions", json=body) as r:
                    if r.status != 200:
                        text = (await r.read()).decode(errors="replace")[:200]
                        problem = f"HTTP {r.status}: {text}"
                        if r.status not in (429, 502, 503, 504):
                            raise RuntimeError(problem)  # final: a 4xx is not a fault to retry
                        with contextlib.suppress(ValueError, TypeError):
                            retry_after = float(r.headers.get("retry-after", 0))
                    else:
                        async for raw in r.content:
                            line = raw.decode().rstrip("\r\n")
                            if not line.startswith("data: "):
                                continue
                            data = line[6:]
                            if data == "[DONE]":
                                break
                            event = json.loads(data)
                            if "error" in event:
                                problem = f"error event: {event['error'].get('message', '')[:200]}"
                                continue
                            for ch in event.get("choices") or ():
                                if ch.get("text"):
                                    if o.ttft_s is None:
                                        o.ttft_s = time.monotonic() - o.started
                                    self._note_token()
                                    texts.append(ch["text"])
                                if ch.get("finish_reason"):
                                    finished = True
                            if event.get("usage"):
                                usage = event["usage"]
            except RuntimeError:
                raise
            except Exception as e:
                problem = f"{type(e).__name__}: {e}"[:200]
            if finished and not problem:
                o.retries = attempt
                o.tokens = int((usage or {}).get("completion_tokens", -1))
                judge(o, self.reference, None, "".join(texts))
                return
            attempt += 1
            o.error = problem or "the stream ended without a finish reason"
            self.retry_reasons.setdefault(o.phase, Counter())["http: " + _reason(o.error)] += 1
            if attempt > self.http_retries:
                o.retries = attempt - 1
                raise RuntimeError(f"after {attempt} attempts: {o.error}")
            await asyncio.sleep(max(retry_after, min(2.0, 0.1 * 2 ** (attempt - 1))))
