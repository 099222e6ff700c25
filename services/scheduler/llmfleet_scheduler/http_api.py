"""OpenAI-compatible HTTP API of the scheduler (FastAPI, served by uvicorn in the scheduler's loop).

Every completion goes through the same entry point as the gRPC ``Submit`` (``Backend.submit`` ->
``SchedulerServicer.open_request``: validation, journal, dispatch, failover); ``n`` choices are
``n`` independent requests (with a seed: seed, seed+1, ...). A client that disconnects cancels its
requests through the journal's cancel path (as the ``Cancel`` RPC)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.security import ApiKey, ApiKeyStore, SecuritySettings, bearer
from llmfleet.security.tls import uvicorn_ssl
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmfleet_scheduler.chat_template import ChatTemplates
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.openai_protocol import (
    MAX_SEED,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    now,
    usage_dict,
)
from llmfleet_scheduler.validation import InvalidField

log = logging.getLogger(__name__)

# SubmitRequest field (validation.py) -> OpenAI request field
_PARAM = {
    "service": "model",
    "sampling.max_tokens": "max_tokens",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.stop": "stop",
    "sampling.seed": "seed",
}
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error", "conflict"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "overloaded"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", "model_not_allowed"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable", "no_engine"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout", "deadline_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "cancelled", "cancelled"),
}
_FINISH = {
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_EOS: "stop",
}


class Backend(Protocol):
    """What the HTTP layer needs from the scheduler (a fake in unit tests)."""

    def ready(self) -> bool: ...

    def servable(self) -> tuple[bool, list[str]]:
        """Whether every service that must be served has an engine (and which have none)."""
        ...

    def services(self) -> dict[str, str]:
        """service name -> model name"""
        ...

    def submit(
        self, request: scheduler_pb2.SubmitRequest, key: ApiKey | None = None
    ) -> tuple[str, AsyncIterator[common_pb2.TokenChunk]]:
        """Start (or attach to) a request for the caller's ``key``: its id and its chunks, the last one
        final. Raises InvalidField or RequestFailed before streaming; the iterator raises RequestFailed."""
        ...

    async def cancel(self, request_id: str) -> bool: ...

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        """``(role, content)`` messages as one prompt, with ``model``'s chat template."""
        ...


@dataclass
class ServicerBackend:
    """The real backend: the gRPC servicer's own submit path."""

    servicer: Any  # SchedulerServicer (not imported: keeps this module light for tests)
    templates: ChatTemplates | None = None  # default: model sources from the servicer's directory

    def __post_init__(self) -> None:
        if self.templates is None:
            self.templates = ChatTemplates(self.servicer.directory.model_source)

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        assert self.templates is not None
        return await self.templates.render(model, messages)

    def ready(self) -> bool:
        return bool(self.servicer.directory.ready)

    def servable(self) -> tuple[bool, list[str]]:
        readiness = self.servicer.readiness
        if readiness is None:
            return self.ready(), [] if self.ready() else ["(not connected to etcd yet)"]
        return readiness.check()

    def services(self) -> dict[str, str]:
        return {name: spec.model for name, spec in self.servicer.directory.services().items()}

    def submit(
        self, request: scheduler_pb2.SubmitRequest, key: ApiKey | None = None
    ) -> tuple[str, AsyncIterator[common_pb2.TokenChunk]]:
        rec = self.servicer.open_request(request, None, key)
        return rec.request_id, self.servicer.follow(rec)

    async def cancel(self, request_id: str) -> bool:
        return await self.servicer.cancel(request_id)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_body(self.message, self.type, self.param, self.code),
            status_code=self.status,
            headers=self.headers,
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def _from_exc(exc: BaseException, prompt_param: str) -> ApiError:
    if isinstance(exc, InvalidField):
        param = (
            "messages"
            if exc.field == "prompt" and prompt_param == "messages"
            else _PARAM.get(exc.field, exc.field)
        )
        msg = str(exc).replace(exc.field, param, 1)
        return ApiError(400, msg, "invalid_request_error", param, "invalid_value")
    if isinstance(exc, RequestFailed):
        status, type_, code = _STATUS.get(exc.code, (500, "internal_error", None))
        param = (
            "model" if exc.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED) else None
        )
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        return ApiError(status, exc.details, type_, param, code, headers)
    if isinstance(exc, ApiError):
        return exc
    return ApiError(500, f"internal error: {exc!r}", "internal_error")


@dataclass
class _Choice:
    index: int
    request_id: str
    chunks: AsyncIterator[common_pb2.TokenChunk]
    text: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    count_prompt: bool = True  # n>1 copies of a prompt count its tokens once


class _Run:
    """The requests of one HTTP call, merged into one stream of (choice, chunk) events."""

    def __init__(self, backend: Backend, choices: list[_Choice]) -> None:
        self.backend = backend
        self.choices = choices
        self.queue: asyncio.Queue[tuple[_Choice, common_pb2.TokenChunk | BaseException | None]] = (
            asyncio.Queue()
        )
        self.tasks = [asyncio.create_task(self._pump(c)) for c in choices]
        self.open = len(choices)

    async def _pump(self, c: _Choice) -> None:
        try:
            async for chunk in c.chunks:
                await self.queue.put((c, chunk))
            await self.queue.put((c, None))
        except Exception as e:  # RequestFailed
            await self.queue.put((c, e))

    async def events(self) -> AsyncIterator[tuple[_Choice, common_pb2.TokenChunk]]:
        """(choice, chunk) until every choice finished; a failed choice raises."""
        while self.open:
            c, item = await self.queue.get()
            if item is None:
                self.open -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                c.prompt_tokens = item.usage.prompt_tokens
                c.completion_tokens = item.usage.completion_tokens
                c.finish_reason = _FINISH.get(item.finish_reason, "stop")
                if item.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
                    raise RequestFailed(grpc.StatusCode.CANCELLED, "request cancelled")
                if item.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    raise RequestFailed(grpc.StatusCode.INTERNAL, "the engine failed the request")
            if item.text:
                c.text.append(item.text)
            yield c, item

    def usage(self) -> dict[str, int]:
        p = sum(c.prompt_tokens for c in self.choices if c.count_prompt)
        return usage_dict(p, sum(c.completion_tokens for c in self.choices))

    async def close(self) -> None:
        """Stop listening; requests still running are cancelled (client gone, or a sibling failed)."""
        for t in self.tasks:
            t.cancel()
        pending = [c.request_id for c in self.choices if c.finish_reason is None]
        if pending:  # in a task: the response being cancelled (client gone) must not stop the cancel
            task = asyncio.ensure_future(self._cancel(pending))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            await asyncio.shield(task)

    async def _cancel(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            try:
                await self.backend.cancel(rid)
            except Exception:
                log.exception("cancelling %s", rid)


_BACKGROUND: set[asyncio.Future] = set()


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _until_disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def create_app(backend: Backend, version: str = "", key_store: ApiKeyStore | None = None) -> FastAPI:
    """The app; with ``key_store`` every /v1 route needs ``Authorization: Bearer <key>`` (401 without
    a valid one; a key limited to some services sees and may use only those: 403 otherwise)."""
    app = FastAPI(title="llmfleet OpenAI-compatible API", version=version or "0")

    def caller(authorization: str | None = Header(None)) -> ApiKey | None:
        if key_store is None:
            return None
        token = bearer(authorization)
        key = key_store.authenticate(token)
        if key is None:
            msg = (
                "Missing API key: send the header 'Authorization: Bearer <key>'"
                if token is None
                else "Incorrect API key provided"
            )
            raise ApiError(401, msg, "invalid_request_error", None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})  # fmt: skip
        return key

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {}
        if err.get("type") == "json_invalid":  # its loc is a byte offset, not a parameter
            where = (err.get("ctx") or {}).get("error", "")
            msg = f"request body: not valid JSON ({where})" if where else "request body: not valid JSON"
            return ApiError(400, msg, "invalid_request_error", None, "invalid_json").response()
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        msg = f"{param or 'request body'}: {err.get('msg', 'invalid request')}"
        return ApiError(400, msg, "invalid_request_error", param, "invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """The framework's own errors (unparseable body, unknown route, wrong method) in OpenAI's shape."""
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400:
            detail = f"request body: {detail}"
        type_ = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        return ApiError(exc.status_code, detail, type_, None, None, exc.headers).response()

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> JSONResponse:
        if backend.ready():
            return JSONResponse({"status": "serving"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 when every service that must be served has an engine with its model."""
        ok, missing = backend.servable()
        if ok:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "waiting", "unserved": missing}, status_code=503)

    @app.get("/version")
    async def get_version() -> dict[str, str]:
        return {"version": version}

    def model_ids(key: ApiKey | None = None) -> dict[str, str]:
        """model id -> service: every service ``key`` may use, plus each model name (its first such
        service, by name)."""
        services = {n: m for n, m in backend.services().items() if key is None or key.allows(n)}
        ids = {name: name for name in sorted(services)}
        for name in sorted(services):
            ids.setdefault(services[name], name)
        return ids

    @app.get("/v1/models")
    async def list_models(key: ApiKey | None = Depends(caller)) -> dict[str, Any]:
        created = now()
        data = [
            {"id": i, "object": "model", "created": created, "owned_by": "llmfleet"} for i in model_ids(key)
        ]
        return {"object": "list", "data": data}

    def resolve(model: str, key: ApiKey | None) -> str:
        service = model_ids().get(model)
        if service is not None and key is not None and not key.allows(service):
            raise ApiError(
                403,
                f"model: API key {key.name!r} may not use {model!r}",
                "permission_error",
                "model",
                "model_not_allowed",
            )
        if service is None:
            if not backend.ready():
                raise ApiError(503, "scheduler is not connected to etcd yet; retry", "service_unavailable")
            known = ", ".join(model_ids()) or "none"
            raise ApiError(
                404,
                f"The model {model!r} does not exist (known: {known})",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return service

    async def start(
        body: CompletionRequest | ChatCompletionRequest, prompts: list[str], param: str, key: ApiKey | None
    ) -> _Run:
        service = resolve(body.model, key)
        if body.seed is not None and body.seed < 0:
            raise ApiError(400, f"seed: must be >= 0, got {body.seed}", "invalid_request_error", "seed")
        if body.seed is not None and body.seed + body.n - 1 > MAX_SEED:  # choice i samples with seed + i
            raise ApiError(
                400,
                f"seed: must be at most {MAX_SEED - body.n + 1} with n={body.n}",
                "invalid_request_error",
                "seed",
            )
        choices: list[_Choice] = []
        try:
            for prompt in prompts:
                for i in range(body.n):
                    s = common_pb2.SamplingParams(stop=body.stop_list())
                    if body.token_limit() is not None:
                        s.max_tokens = body.token_limit()
                    if body.temperature is not None:
                        s.temperature = body.temperature
                    if body.top_p is not None:
                        s.top_p = body.top_p
                    if body.seed is not None:
                        s.seed = body.seed + i
                    req = scheduler_pb2.SubmitRequest(
                        request_id=uuid.uuid4().hex, service=service, prompt=prompt, sampling=s
                    )
                    rid, chunks = backend.submit(req, key)
                    choices.append(_Choice(len(choices), rid, chunks, count_prompt=i == 0))
        except (InvalidField, RequestFailed) as e:
            for c in choices:
                with contextlib.suppress(Exception):
                    await backend.cancel(c.request_id)
            raise _from_exc(e, param) from e
        return _Run(backend, choices)

    async def respond(
        request: Request,
        run: _Run,
        stream: bool,
        include_usage: bool,
        param: str,
        head: Callable[[], dict[str, Any]],
        piece: Callable[[_Choice, str, bool, bool], dict[str, Any]],
        final: Callable[[], dict[str, Any]],
    ):
        events = run.events()
        # Wait for the whole result (or, streaming, the first event: an early failure such as no
        # engine or overload then gets its own status) while watching for the client leaving.
        watcher = asyncio.create_task(_until_disconnected(request))
        work = asyncio.ensure_future(_drain(events) if not stream else anext(events, None))
        try:
            await asyncio.wait({watcher, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not work.done():
            log.info("http client gone: cancelling %d request(s)", len(run.choices))
            work.cancel()
            await run.close()
            return JSONResponse(error_body("client disconnected", "cancelled"), status_code=499)
        exc = work.exception()
        if exc is not None or not stream:
            await run.close()
            return _from_exc(exc, param).response() if exc is not None else JSONResponse(final())
        first = work.result()

        async def body() -> AsyncIterator[bytes]:
            started: set[int] = set()
            try:
                pending = [first] if first is not None else []
                while True:
                    if pending:
                        c, chunk = pending.pop()
                    else:
                        try:
                            c, chunk = await anext(events)
                        except StopAsyncIteration:
                            break
                    new = c.index not in started
                    started.add(c.index)
                    if chunk.text or new:
                        yield _sse(piece(c, chunk.text, new, False))
                    if c.finish_reason is not None:
                        yield _sse(piece(c, "", False, True))
                if include_usage:
                    chunk = head()
                    chunk["choices"] = []
                    chunk["usage"] = run.usage()
                    yield _sse(chunk)
                yield b"data: [DONE]\n\n"
            except Exception as e:  # a failure after the 200 went out: an error event, then the end
                yield _sse(_from_exc(e, param).body())
                yield b"data: [DONE]\n\n"
            finally:  # also on client disconnect (the response task is cancelled)
                await run.close()

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest, key: ApiKey | None = Depends(caller)):
        if not body.prompts() or any(not p for p in body.prompts()):
            raise ApiError(
                400, "prompt: must not be empty", "invalid_request_error", "prompt", "invalid_value"
            )
        run = await start(body, body.prompts(), "prompt", key)
        rid, created = f"cmpl-{uuid.uuid4().hex}", now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def head() -> dict[str, Any]:
            return {"id": rid, "object": "text_completion", "created": created, "model": body.model}

        def piece(c: _Choice, text: str, _new: bool, closing: bool) -> dict[str, Any]:
            # the finish reason rides on an empty closing chunk, so text chunks carry null
            fr = c.finish_reason if closing else None
            out = head()
            out["choices"] = [{"index": c.index, "text": text, "logprobs": None, "finish_reason": fr}]
            if include_usage:
                out["usage"] = None
            return out

        def final() -> dict[str, Any]:
            out = head()
            out["choices"] = [
                {
                    "index": c.index,
                    "text": "".join(c.text),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in run.choices
            ]
            out["usage"] = run.usage()
            return out

        return await respond(request, run, body.stream, include_usage, "prompt", head, piece, final)

    @app.post("/v1/chat/completions")
    async def chat_completions(
        request: Request, body: ChatCompletionRequest, key: ApiKey | None = Depends(caller)
    ):
        model = backend.services()[resolve(body.model, key)]
        try:
            prompt = await backend.render_chat(model, [(m.role, m.text()) for m in body.messages])
        except Exception as e:  # the model's template refuses these messages (e.g. roles out of order)
            raise ApiError(
                400, f"messages: the chat template of {model!r} refused them: {e}", "invalid_request_error",
                "messages", "invalid_value",
            ) from e  # fmt: skip
        run = await start(body, [prompt], "messages", key)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def head() -> dict[str, Any]:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.model,
                "system_fingerprint": None,
            }

        def piece(c: _Choice, text: str, new: bool, closing: bool) -> dict[str, Any]:
            delta: dict[str, Any] = {} if closing else {"content": text}
            if new:
                delta["role"] = "assistant"
            out = head()
            out["choices"] = [
                {
                    "index": c.index,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": c.finish_reason if closing else None,
                }
            ]
            if include_usage:
                out["usage"] = None
            return out

        def final() -> dict[str, Any]:
            out = head()
            out["object"] = "chat.completion"
            out["choices"] = [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": "".join(c.text), "refusal": None},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in run.choices
            ]
            out["usage"] = run.usage()
            return out

        return await respond(request, run, body.stream, include_usage, "messages", head, piece, final)

    return app


async def _drain(events: AsyncIterator[Any]) -> None:
    async for _ in events:
        pass


@dataclass
class HttpServer:
    """uvicorn serving the app inside the running event loop; ``port`` 0 picks a free port."""

    app: FastAPI
    host: str
    port: int
    security: SecuritySettings | None = None  # TLS: HTTPS with the gRPC server's certificate
    _server: Any = None
    _task: asyncio.Task | None = None

    async def start(self) -> None:
        import socket

        import uvicorn

        # Bind here, not in uvicorn: its bind failure is sys.exit(1), which would end the scheduler.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets it knows are TCP (else the first
        # SSE event of each response waits ~40 ms for the client's delayed ACK)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            log.error("OpenAI-compatible API disabled: cannot bind %s:%d: %s", self.host, self.port, e)
            return
        sock.set_inheritable(True)
        self.port = sock.getsockname()[1]
        ssl_kwargs = uvicorn_ssl(self.security) if self.security is not None else {}
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=1,
            **ssl_kwargs,
        )
        self._server = uvicorn.Server(config)
        self._server.capture_signals = contextlib.nullcontext  # the service owns SIGINT/SIGTERM
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="scheduler-http")
        log.info("OpenAI-compatible API on %s", self.url)

    @property
    def url(self) -> str:
        scheme = "https" if self.security is not None and self.security.server_tls else "http"
        return f"{scheme}://{self.host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(self._task, 5)
