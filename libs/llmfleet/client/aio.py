"""``AsyncClient``: the asyncio SDK for the llmfleet scheduler.

    async with AsyncClient("127.0.0.1:50051") as client:
        stream = client.generate("Hello", service="chat", max_tokens=32)
        async for chunk in stream:
            print(chunk.text, end="", flush=True)
        print(stream.usage)

Streams are resumable: when the scheduler becomes UNAVAILABLE mid-stream the client reconnects with
the same request id (the scheduler attaches to the running request and replays it) and drops tokens
it already delivered, so the caller sees every token exactly once.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TypeVar

import grpc

from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.client.errors import Cancelled, Internal, InvalidArgument, from_rpc_error
from llmfleet.client.resume import StreamResumer
from llmfleet.client.retry import Backoff, remaining, unaccepted
from llmfleet.client.types import Chunk, Completion, ServiceInfo, Usage, usage_from_chunk
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.mux import SUBMIT_MANY, MuxLink, MuxStream
from llmfleet.security import SecuritySettings

DEFAULT_ADDRESS = "127.0.0.1:50051"
SPREAD_SKIP_S = 5.0  # spread: how long a replica that failed is left out
T = TypeVar("T")


def parse_addresses(address: str | Sequence[str]) -> list[str]:
    """``"h1:50051,h2:50051"`` or a list of ``host:port``: the scheduler replicas, in order."""
    items = address.split(",") if isinstance(address, str) else list(address)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ValueError(f"no scheduler address in {address!r}")
    return out


def new_request_id() -> str:
    """A fresh client-side request id (uuid4 hex)."""
    return uuid.uuid4().hex


def build_submit_request(
    prompt: str,
    service: str,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    request_id: str | None = None,
    session: str = "",
    priority: int | None = None,
) -> scheduler_pb2.SubmitRequest:
    """The SubmitRequest for these arguments; unset options are left unset (server defaults apply).

    Raises :class:`InvalidArgument` for values protobuf cannot represent (e.g. a negative seed);
    range checks (``max_tokens > 0`` ...) are the scheduler's, so its message is the one users see.
    """
    try:
        sampling = common_pb2.SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=[stop] if isinstance(stop, str) else list(stop or ()),
        )
        return scheduler_pb2.SubmitRequest(
            request_id=request_id or new_request_id(),
            service=service,
            prompt=prompt,
            sampling=sampling,
            session=session,
            priority=priority,
        )
    except (TypeError, ValueError) as e:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: {e}") from None


class GenerateStream:
    """An async iterator of :class:`Chunk` for one request; lazily starts the call on first iteration.

    After the stream is exhausted ``usage`` (and ``finish_reason``) are set. ``await text()`` and
    ``await collect()`` consume the rest and return everything, including chunks already iterated.
    """

    def __init__(self, client: AsyncClient, request: scheduler_pb2.SubmitRequest, timeout_s: float | None):
        self._client = client
        self._request = request
        self._timeout_s = timeout_s
        self.request_id: str = request.request_id
        self.usage: Usage | None = None
        self.engine_id: str = ""
        self.attempts: int = 0
        self._resumer = StreamResumer(request_id=request.request_id)
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._gen: AsyncGenerator[Chunk, None] | None = None
        self._call: MuxStream | None = None
        self._address: str | None = None  # the replica of the current attempt

    @property
    def finish_reason(self) -> str | None:
        return self.usage.finish_reason if self.usage is not None else None

    @property
    def finished(self) -> bool:
        return self.usage is not None

    def __aiter__(self) -> GenerateStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    async def text(self) -> str:
        """The whole completion text (consumes the rest of the stream)."""
        async for _ in self:
            pass
        return "".join(self._text)

    async def collect(self) -> Completion:
        """The whole completion (consumes the rest of the stream)."""
        text = await self.text()
        if self.usage is None:  # only after aclose(): a live stream ends normally after its final chunk
            raise Cancelled(grpc.StatusCode.CANCELLED, "the stream was closed before the request finished")
        return Completion(
            text=text, token_ids=tuple(self._token_ids), usage=self.usage, request_id=self.request_id
        )

    async def cancel(self, timeout_s: float | None = None) -> bool:
        """Cancel the request on the scheduler (not just this stream); True if it was still running."""
        try:
            return await self._client.cancel(self.request_id, timeout_s=timeout_s)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Stop reading: cancels the RPC (the scheduler may keep running the request; see cancel())."""
        gen, self._gen = self._gen, _exhausted()
        if self._call is not None:
            self._call.cancel()
        if gen is not None:
            await gen.aclose()

    async def __aenter__(self) -> GenerateStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals -------------------------------------------------------------------------------------
    async def _run(self) -> AsyncGenerator[Chunk, None]:
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        backoff = self._client._backoff(deadline, f"request {self.request_id}")
        try:
            while True:
                try:
                    async with contextlib.aclosing(self._attempt(deadline)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    return
                except grpc.aio.AioRpcError as e:  # never the consumer's GeneratorExit
                    if not await backoff.again(e, self._address):
                        raise
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(
                e, request_id=self.request_id, tls=self._client.security.client_tls
            ) from None

    async def _attempt(self, deadline: float | None) -> AsyncGenerator[Chunk, None]:
        timeout = remaining(deadline, self.request_id)
        self.attempts += 1
        self._resumer.begin_attempt()
        request = self._request
        if self._token_ids:  # a retry: the replica continues from what we hold if it lost the request
            request = scheduler_pb2.SubmitRequest()
            request.CopyFrom(self._request)
            request.resume_token_ids.extend(self._token_ids)
        call, self._address = self._client._open_submit(request, timeout)
        self._call = call
        received = False
        try:
            async for msg in call:
                received = True
                if msg.engine_id:
                    self.engine_id = msg.engine_id
                chunk = self._resumer.accept(msg)
                if msg.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED and self.usage is None:
                    self.usage = usage_from_chunk(msg, self.engine_id)
                if chunk is not None:
                    self._text.append(chunk.text)
                    self._token_ids.extend(chunk.token_ids)
                    yield chunk
        except grpc.aio.AioRpcError as e:
            if self.usage is None:  # an error after the final chunk changes nothing for the caller
                raise unaccepted(e, received) from None
        finally:
            self._call = None
            if not call.done():
                call.cancel()
        if self.usage is None:
            raise Internal(
                grpc.StatusCode.INTERNAL,
                "the scheduler ended the stream without a final chunk",
                request_id=self.request_id,
            )


async def _exhausted() -> AsyncGenerator[Chunk, None]:
    return
    yield  # pragma: no cover - makes this an async generator


class AsyncClient:
    """Async client for the scheduler at ``address``: ``host:port``, several as ``"h1:50051,h2:50051"``
    or a list (scheduler replicas; calls go to one, and move to the next when it is unavailable).

    ``timeout_s`` is the default deadline of every call (None: no deadline); ``retries`` is how many
    times a call is retried after UNAVAILABLE (exponential backoff from ``backoff_s`` up to
    ``max_backoff_s``) or an overload (after the server's retry pushback). No other status is retried.
    ``api_key`` (default: env ``LLMFLEET_API_KEY``) is sent as ``authorization: Bearer``; ``tls_ca``
    (default: env ``LLMFLEET_TLS_CA``) is the CA that verifies the scheduler, and ``tls=True`` uses TLS
    with the system's roots. The channel opens lazily on first use. A stream cut by a replica's death is
    resumed on the next one with the same request id and the tokens already received, so its tokens
    arrive exactly once.

    Every stream to a replica rides one ``SubmitMany`` call (tokens in batches; docs/architecture.md,
    the data path); while tracing is on, each stream has its own span in its request's trace.
    ``spread``: requests go round-robin over all the replicas (several scheduler processes share the
    load) instead of to one; a replica that fails is left out for a few seconds.
    """

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        timeout_s: float | None = None,
        retries: int = 3,
        *,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        api_key: str | None = None,
        tls_ca: str | None = None,
        tls: bool = False,
        spread: bool = False,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.addresses = parse_addresses(address)
        self._current = 0
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.security = SecuritySettings.from_env(api_key=api_key, tls_ca=tls_ca, tls=tls)
        self._channel: grpc.aio.Channel | None = None
        self._stub: scheduler_pb2_grpc.SchedulerStub | None = None
        self._retired: list[grpc.aio.Channel] = []  # channels to replicas we failed over from
        # every stream to a replica rides one SubmitMany call (llmfleet.rpc.mux)
        self._links: dict[str, MuxLink] = {}
        self._retired_links: list[MuxLink] = []
        # spread: requests go round-robin over every replica (one SubmitMany call each) instead of
        # to one; a replica that failed is skipped for SPREAD_SKIP_S
        self.spread = spread
        self._rr = 0
        self._down: dict[str, float] = {}
        self._spread_channels: dict[str, grpc.aio.Channel] = {}

    # -- API -------------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        service: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        request_id: str | None = None,
        session: str = "",
        priority: int | None = None,
        timeout_s: float | None = None,
    ) -> GenerateStream:
        """Start a completion; iterate the returned stream for :class:`Chunk` s (the call starts lazily)."""
        request = build_submit_request(
            prompt,
            service,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            request_id=request_id,
            session=session,
            priority=priority,
        )
        return GenerateStream(self, request, timeout_s if timeout_s is not None else self.timeout_s)

    async def complete(
        self,
        prompt: str,
        service: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        request_id: str | None = None,
        session: str = "",
        priority: int | None = None,
        timeout_s: float | None = None,
    ) -> Completion:
        """Run a completion to the end and return it whole."""
        stream = self.generate(
            prompt,
            service,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            request_id=request_id,
            session=session,
            priority=priority,
            timeout_s=timeout_s,
        )
        async with stream:
            return await stream.collect()

    async def cancel(self, request_id: str, *, timeout_s: float | None = None) -> bool:
        """Cancel a request by id; False when it was unknown or already finished."""
        request = common_pb2.CancelRequest(request_id=request_id)
        resp = await self._unary(
            lambda t: self._scheduler().Cancel(request, timeout=t), timeout_s, f"cancel {request_id}"
        )
        return bool(resp.found)

    async def list_services(self, *, timeout_s: float | None = None) -> list[ServiceInfo]:
        """The services the scheduler serves."""
        resp = await self._unary(
            lambda t: self._scheduler().ListServices(scheduler_pb2.ListServicesRequest(), timeout=t),
            timeout_s,
            "list_services",
        )
        return [ServiceInfo.from_proto(s) for s in resp.services]

    async def close(self) -> None:
        """Close the channel (open streams fail with CANCELLED)."""
        channel, self._channel, self._stub = self._channel, None, None
        retired, self._retired = self._retired, []
        links, self._links, self._retired_links = [*self._links.values(), *self._retired_links], {}, []
        for link in links:
            await link.close()
        retired += list(self._spread_channels.values())
        self._spread_channels = {}
        for ch in [*retired, *([channel] if channel is not None else [])]:
            await ch.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncClient({','.join(self.addresses)!r}, timeout_s={self.timeout_s}, retries={self.retries})"
        )

    @property
    def address(self) -> str:
        """The scheduler replica calls go to now."""
        return self.addresses[self._current]

    async def _failover(self, failed: str) -> None:
        """``failed`` was unavailable: move to the next scheduler replica (a no-op with one address, or
        when another call already moved on from ``failed``); the next call opens a channel there."""
        if self.spread:
            self._down[failed] = time.monotonic() + SPREAD_SKIP_S
        if len(self.addresses) < 2 or self.address != failed:
            return
        channel, self._channel, self._stub = self._channel, None, None
        self._current = (self._current + 1) % len(self.addresses)
        if (link := self._links.pop(failed, None)) is not None:
            self._retired_links.append(link)
        if channel is not None:  # other calls may still be on it: they end on their own; closed at close()
            self._retired.append(channel)

    # -- internals -------------------------------------------------------------------------------------
    def _backoff(self, deadline: float | None, what: str) -> Backoff:
        """The retry schedule of one call (``what`` names it in the retry warnings)."""
        return Backoff(
            self.retries,
            self.backoff_s,
            self.max_backoff_s,
            self._failover,
            lambda: self.address,
            deadline,
            what,
        )

    def _open_submit(
        self, request: scheduler_pb2.SubmitRequest, timeout: float | None
    ) -> tuple[MuxStream, str]:
        """Start ``request`` on a replica (the current one, or the next with ``spread``) on its
        SubmitMany call. Returns the stream and the replica's address."""
        address = self._next_replica() if self.spread and len(self.addresses) > 1 else self.address
        link = self._links.get(address)
        if link is None:
            stub = self._stub_at(address)
            link = self._links[address] = MuxLink(
                lambda: stub.SubmitMany(),
                scheduler_pb2.SubmitCommands,
                SUBMIT_MANY,
                name=f"scheduler {address}",
            )
        return link.open(request.request_id, request, timeout), address

    def _next_replica(self) -> str:
        now, n = time.monotonic(), len(self.addresses)
        for _ in range(n):
            address = self.addresses[self._rr % n]
            self._rr += 1
            if self._down.get(address, 0.0) <= now:
                return address
        return self.address  # every replica failed lately: the current one

    def _stub_at(self, address: str) -> scheduler_pb2_grpc.SchedulerStub:
        if address == self.address:
            return self._scheduler()
        ch = self._spread_channels.get(address)
        if ch is None:
            ch = self._spread_channels[address] = open_channel(address, self.security)
        return scheduler_pb2_grpc.SchedulerStub(ch)

    def _scheduler(self) -> scheduler_pb2_grpc.SchedulerStub:
        if self._stub is None:
            self._channel = open_channel(self.address, self.security)
            self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self._stub

    async def _unary(
        self, call: Callable[[float | None], Awaitable[T]], timeout_s: float | None, what: str
    ) -> T:
        timeout_s = timeout_s if timeout_s is not None else self.timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        backoff = self._backoff(deadline, what)
        try:
            while True:
                address = self.address
                try:
                    return await call(remaining(deadline))
                except grpc.aio.AioRpcError as e:
                    if not await backoff.again(e, address):
                        raise
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, tls=self.security.client_tls) from None
