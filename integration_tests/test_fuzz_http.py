"""Fuzzing the scheduler's OpenAI-compatible HTTP API with schemathesis, from the OpenAPI schema the
API serves at /openapi.json, against a live cluster (one engine).

Every operation gets ``LLMFLEET_FUZZ_EXAMPLES`` examples (default 25) of valid and invalid requests
(schemathesis' positive and negative modes: wrong types, out-of-range numbers, missing fields,
huge values); half the JSON bodies name a served model (``chat``) so they get past model lookup to
validation and generation. Every response must be below 500, and every 4xx an OpenAI-shaped error
(``{"error": {"message", "type", "param", "code"}}``); a 400 about one parameter names it in
``param`` and in the message. After the run the scheduler process must still be alive.
"""

from __future__ import annotations

import os
import zlib

import httpx
import pytest
import schemathesis
from harness import Cluster, launch
from hypothesis import HealthCheck, given, settings
from llmfleet.supervisor import free_port
from schemathesis import GenerationMode

EXAMPLES = int(os.environ.get("LLMFLEET_FUZZ_EXAMPLES", "25"))
SERVED = "chat"  # a service of the default test config (tiny-llama, endless: stops at max_tokens)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    port = free_port()
    c = launch(
        tmp_path_factory.mktemp("cluster"),
        engines=1,
        placement_replicas=1,
        scheduler_args=("--http-port", str(port)),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):  # the HTTP server starts with the service
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            c.procs["scheduler"].wait(0.1)
        yield c, base
    finally:
        c.stop()


@pytest.fixture(scope="module")
def api_schema(api):
    _, base = api
    return schemathesis.openapi.from_url(f"{base}/openapi.json")


# Every operation of the schema (test_every_operation_is_fuzzed keeps this list whole); schemathesis'
# own pytest plugin (schema.parametrize / from_fixture) does not run under pytest 9, so the cases are
# drawn from each operation's strategy under a plain @given. GETs take no parameters: no negative cases.
OPERATIONS = [
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/version"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
]
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
CASES = [
    (m, p, mode) for m, p in OPERATIONS for mode in MODES if m == "POST" or mode == GenerationMode.POSITIVE
]


def test_every_operation_is_fuzzed(api_schema):
    ops = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert ops == set(OPERATIONS)


def _check_error(status: int, body: object, where: str) -> None:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"not an OpenAI error: {where}"
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"error without message: {where}"
    assert isinstance(err.get("type"), str) and err["type"], f"error without type: {where}"
    assert {"param", "code"} <= set(err), f"error without param/code keys: {where}"
    if status == 400 and err["type"] == "invalid_request_error" and err["param"]:
        assert err["param"] in err["message"], f"message does not name the param: {where}"


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES]
)
def test_openai_api_fuzz(api, api_schema, method, path, mode):
    cluster: Cluster = api[0]
    strategy = api_schema[path][method].as_strategy(generation_mode=mode)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=not os.environ.get("LLMFLEET_FUZZ_RANDOM"),
    )
    @given(strategy)
    def run(case):
        if isinstance(case.body, dict) and zlib.crc32(repr(case.body).encode()) % 2:
            case.body["model"] = SERVED  # past model lookup, into validation and generation
        response = case.call(timeout=60)
        where = f"{method} {path} -> {response.status_code}: {response.text[:400]!r}\nbody: {case.body!r}"
        where = where[:1500]
        assert response.status_code < 500, where
        if 400 <= response.status_code < 500:
            _check_error(response.status_code, response.json(), where)

    try:
        run()
    finally:
        assert cluster.procs["scheduler"].alive, cluster.procs["scheduler"].log_tail()
