"""The OpenAI-compatible HTTP layer against a fake submit path."""

from __future__ import annotations

import asyncio
import functools
import json

import grpc
import pytest
from fastapi.testclient import TestClient
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.security import ApiKeyStore
from llmfleet_scheduler.chat_template import render_default
from llmfleet_scheduler.http_api import create_app
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.validation import validate_submit


class FakeBackend:
    """Echoes words of ``reply`` one chunk each; honours max_tokens and stop like an engine; reports
    ``cached`` prompt tokens found in a prefix cache (at most the prompt's)."""

    def __init__(
        self,
        reply: str = "a b c d e f",
        fail: RequestFailed | None = None,
        ready: bool = True,
        cached: int = 0,
    ):
        self.reply = reply.split(" ")
        self.cached = cached
        self.fail = fail
        self._ready = ready
        self.submitted: list[scheduler_pb2.SubmitRequest] = []
        self.cancelled: list[str] = []
        self.block_after: int | None = None

    def ready(self) -> bool:
        return self._ready

    def servable(self) -> tuple[bool, list[str]]:
        return self._ready, [] if self._ready else ["chat"]

    def services(self) -> dict[str, str]:
        return {"chat": "tiny-llama", "summarize": "tiny-qwen2", "chat2": "tiny-llama"}

    def submit(self, request, key=None):
        validate_submit(request)  # the real path validates: InvalidField before any work
        if request.service not in self.services():
            raise RequestFailed(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        self.submitted.append(request)
        return request.request_id, functools.partial(self._follow, request)

    async def _follow(self, request, emit):
        async for chunk in self._chunks(request):
            emit(chunk)

    async def _chunks(self, request):
        if self.fail is not None:
            raise self.fail
        s = request.sampling
        limit = s.max_tokens if s.HasField("max_tokens") else 16
        words = [f"{w}{s.seed}" if s.HasField("seed") else w for w in self.reply]
        text, n, reason = "", 0, common_pb2.FINISH_REASON_EOS
        for w in words:
            if self.block_after is not None and n >= self.block_after:
                await asyncio.sleep(3600)
            if n == limit:
                reason = common_pb2.FINISH_REASON_LENGTH
                break
            piece = (" " if n else "") + w
            if any(st in text + piece for st in s.stop):
                reason = common_pb2.FINISH_REASON_STOP
                break
            yield common_pb2.TokenChunk(request_id=request.request_id, index=n, token_ids=[n], text=piece)
            text += piece
            n += 1
            await asyncio.sleep(0)
        yield common_pb2.TokenChunk(
            request_id=request.request_id,
            index=n,
            finish_reason=reason,
            usage=common_pb2.Usage(
                prompt_tokens=len(request.prompt.split()),
                completion_tokens=n,
                cached_tokens=min(self.cached, len(request.prompt.split())),
            ),
        )

    async def cancel(self, request_id: str) -> bool:
        self.cancelled.append(request_id)
        return True

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        return render_default(messages)


def client(backend: FakeBackend | None = None) -> tuple[TestClient, FakeBackend]:
    b = backend or FakeBackend()
    return TestClient(create_app(b, version="9.9.9")), b


def sse(resp) -> list:
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in resp.headers  # streamed in chunks as the tokens come
    raw = resp.text
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == ""
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ")
        payload = e[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    assert out[-1] == "[DONE]"
    return out[:-1]


def test_models_lists_services_and_model_names():
    c, _ = client()
    r = c.get("/v1/models")
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert ids == ["chat", "chat2", "summarize", "tiny-llama", "tiny-qwen2"]
    assert all(m["owned_by"] == "llmfleet" and m["object"] == "model" for m in r.json()["data"])


def test_model_name_routes_to_first_service_using_it():
    c, b = client()
    r = c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "hi"})
    assert r.status_code == 200
    assert b.submitted[0].service == "chat"


def test_health_and_version():
    c, _ = client()
    assert c.get("/health").status_code == 200
    assert c.get("/version").json() == {"version": "9.9.9"}
    c2, _ = client(FakeBackend(ready=False))
    assert c2.get("/health").status_code == 503


def test_completion_usage_and_finish_length():
    c, b = client()
    r = c.post(
        "/v1/completions", json={"model": "chat", "prompt": "one two", "max_tokens": 3, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "chat"
    assert body["choices"] == [{"index": 0, "text": "a b c", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    s = b.submitted[0].sampling
    assert s.max_tokens == 3 and s.temperature == 0 and not s.HasField("top_p")


def test_finish_stop_on_eos_and_stop_strings():
    c, b = client()
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "x"})
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "x", "stop": "c"})
    assert r.json()["choices"][0] == {"index": 0, "text": "a b", "logprobs": None, "finish_reason": "stop"}
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "x", "stop": ["zz", "d"]})
    assert r.json()["choices"][0]["text"] == "a b c"
    assert list(b.submitted[-1].sampling.stop) == ["zz", "d"]


def test_n_choices_are_independent_requests_with_seed_plus_i():
    c, b = client(FakeBackend(cached=1))
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "p q", "n": 3, "seed": 7, "max_tokens": 2})
    body = r.json()
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
    assert [ch["text"] for ch in body["choices"]] == ["a7 b7", "a8 b8", "a9 b9"]
    assert [s.sampling.seed for s in b.submitted] == [7, 8, 9]
    assert len({s.request_id for s in b.submitted}) == 3
    # the prompt and its cached tokens count once, as OpenAI counts n choices of one prompt
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 6,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def test_chat_renders_default_template_and_max_completion_tokens():
    c, b = client()
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    r = c.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": msgs, "max_tokens": 5, "max_completion_tokens": 2},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "a b"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert b.submitted[0].prompt == "system: be brief\nuser: hi\nassistant:"
    assert b.submitted[0].sampling.max_tokens == 2


def test_default_template():
    assert render_default([("user", "x")]) == "user: x\nassistant:"


def test_completion_stream_sse_framing_and_usage_chunk():
    c, _ = client()
    r = c.post(
        "/v1/completions",
        json={
            "model": "chat",
            "prompt": "x",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    events = sse(r)
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert "".join(texts) == "a b"
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]] == [None, None, "length"]
    assert all(e["object"] == "text_completion" for e in events)
    assert all(e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "total_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert len({e["id"] for e in events}) == 1


def test_chat_stream_n2_role_then_content_then_finish():
    c, _ = client()
    r = c.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True},
    )
    events = sse(r)
    assert all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in events)
    for i in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(ch["delta"].get("content", "") for ch in mine) == "a b c d e f"
        assert mine[-1] == {"index": i, "delta": {}, "logprobs": None, "finish_reason": "stop"}
        assert all(ch["finish_reason"] is None for ch in mine[:-1])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_text_survives_json_escaping(route):
    """Every piece after a choice's first is built from a template around its JSON-encoded text:
    quotes, backslashes, control characters and non-ASCII text come back as sent."""
    words = ["say", '"hi"', "back\\slash", "tab\tnew\nline", "ü", "😀", "</x>", "\x00nul", "{}"]
    c, _ = client(FakeBackend(reply=" ".join(words)))
    body = {"model": "chat", "stream": True, "max_tokens": 50}
    body |= (
        {"prompt": "x"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    )
    events = sse(c.post(route, json=body))
    pieces = [
        e["choices"][0].get("text", e["choices"][0].get("delta", {}).get("content", "")) for e in events
    ]
    assert "".join(p or "" for p in pieces) == " ".join(words)
    assert len({(e["id"], e["created"]) for e in events}) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "chat", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "chat", "prompt": "x", "temperature": -1}, "temperature"),
        ({"model": "chat", "prompt": "x", "top_p": 2}, "top_p"),
        ({"model": "chat", "prompt": "x", "stop": [""]}, "stop"),
        ({"model": "chat", "prompt": "x", "n": 0}, "n"),
        ({"model": "chat", "prompt": "x", "seed": -1}, "seed"),
        ({"model": "chat", "prompt": ""}, "prompt"),
        ({"model": "chat", "prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x"}, "model"),
        ({"model": "chat"}, "prompt"),
    ],
)
def test_bad_fields_are_400_naming_the_field(body, param):
    c, b = client()
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["message"]
    assert not b.submitted


def test_chat_bad_messages_are_400():
    c, _ = client()
    r = c.post("/v1/chat/completions", json={"model": "chat", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = c.post(
        "/v1/chat/completions", json={"model": "chat", "messages": [{"role": "wizard", "content": "x"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages.0.role")
    r = c.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "x"}], "top_p": 0},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"


def test_unknown_model_is_404():
    c, _ = client()
    r = c.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("code", "status"),
    [(grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.UNAVAILABLE, 503)],
)
def test_scheduler_errors_map_to_status(stream, code, status):
    c, b = client(FakeBackend(fail=RequestFailed(code, "boom")))
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "x", "stream": stream, "n": 2})
    assert r.status_code == status
    assert r.json()["error"]["message"] == "boom"
    assert sorted(b.cancelled) == sorted(s.request_id for s in b.submitted)  # siblings cancelled


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("block_after", [0, 2])
def test_disconnect_cancels_the_request(stream, block_after):
    """A client that goes away (before or after the first token): its request is cancelled."""
    b = FakeBackend()
    b.block_after = block_after
    app = create_app(b)

    async def go():
        sent: list[dict] = []
        msgs = [
            {
                "type": "http.request",
                "body": json.dumps({"model": "chat", "prompt": "x", "stream": stream}).encode(),
            },
        ]

        async def receive():
            if msgs:
                return msgs.pop(0)
            await asyncio.sleep(0.2)
            return {"type": "http.disconnect"}

        async def send(m):
            sent.append(m)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("t", 1),
            "server": ("t", 80),
        }
        await asyncio.wait_for(app(scope, receive, send), 5)
        return sent

    asyncio.run(go())
    assert b.cancelled == [b.submitted[0].request_id]


# -- API keys and overload ----------------------------------------------------------------------------
def keyed_client(tmp_path, backend: FakeBackend | None = None) -> TestClient:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "keys:\n  - {name: team-a, key: sk-team-a-0001, services: [chat]}\n  - {name: ops, key: sk-ops-00001}\n"
    )
    return TestClient(create_app(backend or FakeBackend(), version="1", key_store=ApiKeyStore.load(keys)))


def body(model: str = "chat") -> dict:
    return {"model": model, "prompt": "hi", "max_tokens": 2}


def test_missing_and_wrong_keys_get_401_in_openai_shape(tmp_path):
    c = keyed_client(tmp_path)
    r = c.post("/v1/completions", json=body())
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and "Authorization: Bearer" in err["message"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = c.post("/v1/completions", json=body(), headers={"Authorization": "Bearer sk-team-a-0002"})
    assert r.status_code == 401 and r.json()["error"]["message"] == "Incorrect API key provided"
    # the key is checked before the body: an unauthenticated caller learns nothing about the API
    r = c.post("/v1/completions", json={"model": "chat"})
    assert r.status_code == 401
    assert c.get("/v1/models").status_code == 401
    assert c.get("/health").status_code == 200 and c.get("/version").status_code == 200


def test_a_key_sees_and_uses_only_its_services(tmp_path):
    backend = FakeBackend()
    c = keyed_client(tmp_path, backend)
    team = {"Authorization": "Bearer sk-team-a-0001"}
    ids = [m["id"] for m in c.get("/v1/models", headers=team).json()["data"]]
    assert ids == ["chat", "tiny-llama"]  # its service, and the model name that routes to it
    assert c.post("/v1/completions", json=body("chat"), headers=team).status_code == 200
    r = c.post("/v1/completions", json=body("summarize"), headers=team)
    assert r.status_code == 403
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_allowed" and "team-a" in err["message"]
    ops = {"Authorization": "Bearer sk-ops-00001"}
    assert c.post("/v1/completions", json=body("summarize"), headers=ops).status_code == 200
    assert len(c.get("/v1/models", headers=ops).json()["data"]) == 5
    assert [r.service for r in backend.submitted] == ["chat", "summarize"]


def test_overload_is_429_with_retry_after():
    fail = RequestFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, "service 'chat' is overloaded", retry_after_s=7)
    c = TestClient(create_app(FakeBackend(fail=fail)))
    for stream in (False, True):
        r = c.post("/v1/completions", json={**body(), "stream": stream})
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert r.json()["error"]["type"] == "rate_limit_error"


def test_a_chat_template_that_refuses_the_messages_is_a_400():
    class Refusing(FakeBackend):
        async def render_chat(self, model, messages):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")

    c = TestClient(create_app(Refusing()))
    r = c.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages" and "tiny-llama" in err["message"] and "alternate" in err["message"]


# ---- found by fuzzing (integration_tests/test_fuzz_http.py)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "chat", "prompt": "x", "max_tokens": 2**31}, "max_tokens"),  # was a 500 (int32 overflow)
        (
            {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2**40},
            None,
        ),
        ({"model": "chat", "messages": [{"role": "tool"}], "max_completion_tokens": -3887191880}, None),
        ({"model": "chat", "prompt": "x", "max_tokens": -(2**31) - 1}, "max_tokens"),
        ({"model": "chat", "prompt": "x", "seed": 2**64}, "seed"),  # was a 500 (uint64 overflow)
        ({"model": "chat", "prompt": "x", "seed": 2**64 - 1, "n": 2}, "seed"),  # seed + 1 overflowed
        ({"model": "chat", "prompt": "x", "top_p": 1e-50}, "top_p"),  # float32: 0
    ],
)
def test_out_of_range_numbers_are_400_naming_the_param(body, param):
    c, b = client()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    param = param or "max_completion_tokens"
    assert err["param"] == param and param in err["message"], err
    assert not b.submitted


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"\x00", {"content-type": "application/json"}),  # was param "0", message "0: JSON decode error"
        (b"{", {"content-type": "application/json"}),
        (b"\x00\x00", {"content-type": "multipart/form-data"}),  # was FastAPI's {"detail": ...}
        (b"a=b", {"content-type": "application/x-www-form-urlencoded"}),
    ],
)
def test_unparseable_bodies_are_openai_shaped_400s(content, headers):
    c, b = client()
    r = c.post("/v1/completions", content=content, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] is None and "body" in err["message"], err
    assert not b.submitted


def test_unknown_routes_and_methods_are_openai_shaped():
    c, _ = client()
    r = c.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = c.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"], r.text


def test_a_session_reaches_the_submit_path_and_is_bounded():
    c, b = client()
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "session": "conv-7"})
    assert r.status_code == 200 and b.submitted[0].session == "conv-7"
    msgs = [{"role": "user", "content": "hi"}]
    r = c.post("/v1/chat/completions", json={"model": "chat", "messages": msgs, "session": "conv-8"})
    assert r.status_code == 200 and b.submitted[1].session == "conv-8"
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    assert r.status_code == 200 and b.submitted[2].session == ""  # none named
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "session": "c" * 129})
    assert r.status_code == 400 and "session" in r.text and len(b.submitted) == 3
