"""``Client``: the blocking SDK, a thin wrapper running an :class:`AsyncClient` on a private event loop.

    with Client("127.0.0.1:50051") as client:
        for chunk in client.generate("Hello", service="chat"):
            print(chunk.text, end="", flush=True)

Each Client owns one daemon thread with its own event loop; calls block the caller until the loop
answers. Streams stay lazy: each ``next()`` pulls one chunk. A Client may be used from several
threads (calls are serialised onto its loop), and inside an async program (it never touches the
caller's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from llmfleet.client.aio import DEFAULT_ADDRESS, AsyncClient, GenerateStream
from llmfleet.client.types import Chunk, Completion, ServiceInfo, Usage

T = TypeVar("T")
_END = object()


class _LoopThread:
    """An event loop running forever in a daemon thread; ``run(coro)`` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="llmfleet-client-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt while blocked: do not leave the call running
            raise

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.run(self.loop.shutdown_asyncgens())  # close streams the caller abandoned
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        if not self.loop.is_closed():
            self.loop.close()


async def _next_or_end(stream: GenerateStream) -> Any:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END


class GenerateIterator:
    """A blocking iterator of :class:`Chunk` over one request (see :class:`GenerateStream`)."""

    def __init__(self, runner: _LoopThread, stream: GenerateStream) -> None:
        self._runner = runner
        self._stream = stream
        self.request_id: str = stream.request_id

    @property
    def usage(self) -> Usage | None:
        return self._stream.usage

    @property
    def finish_reason(self) -> str | None:
        return self._stream.finish_reason

    @property
    def engine_id(self) -> str:
        return self._stream.engine_id

    @property
    def attempts(self) -> int:
        return self._stream.attempts

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        item = self._runner.run(_next_or_end(self._stream))
        if item is _END:
            raise StopIteration
        return item

    def text(self) -> str:
        """The whole completion text (consumes the rest of the stream)."""
        return self._runner.run(self._stream.text())

    def collect(self) -> Completion:
        """The whole completion (consumes the rest of the stream)."""
        return self._runner.run(self._stream.collect())

    def cancel(self, timeout_s: float | None = None) -> bool:
        """Cancel the request on the scheduler; True if it was still running."""
        return self._runner.run(self._stream.cancel(timeout_s))

    def close(self) -> None:
        """Stop reading (cancels the RPC, not the request)."""
        self._runner.run(self._stream.aclose())

    def __enter__(self) -> GenerateIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """Blocking client; same arguments and methods as :class:`AsyncClient`."""

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
    ) -> None:
        self._aclient = AsyncClient(
            address,
            timeout_s,
            retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            api_key=api_key,
            tls_ca=tls_ca,
            tls=tls,
        )
        self._runner = _LoopThread()
        self._closed = False

    @property
    def address(self) -> str:
        return self._aclient.address

    @property
    def timeout_s(self) -> float | None:
        return self._aclient.timeout_s

    @property
    def retries(self) -> int:
        return self._aclient.retries

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
    ) -> GenerateIterator:
        """Start a completion; iterate the result for :class:`Chunk` s (the call starts lazily)."""
        stream = self._aclient.generate(
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
        return GenerateIterator(self._runner, stream)

    def complete(
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
        return self._runner.run(
            self._aclient.complete(
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
        )

    def cancel(self, request_id: str, *, timeout_s: float | None = None) -> bool:
        """Cancel a request by id; False when it was unknown or already finished."""
        return self._runner.run(self._aclient.cancel(request_id, timeout_s=timeout_s))

    def list_services(self, *, timeout_s: float | None = None) -> list[ServiceInfo]:
        """The services the scheduler serves."""
        return self._runner.run(self._aclient.list_services(timeout_s=timeout_s))

    def close(self) -> None:
        """Close the channel and stop the private event loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._aclient.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({','.join(self._aclient.addresses)!r}, timeout_s={self.timeout_s}, retries={self.retries})"
