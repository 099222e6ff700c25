"""The OpenAI front (``llmfleet-front``, two workers on one port) in front of a scheduler with API keys,
driven by the official ``openai`` package: completions, streamed chat, a wrong key (401), a bad field
(400 naming it), a key's rate limit and ``max_priority`` enforced by the scheduler through the front,
a client leaving mid-stream (its request is cancelled), the front's own ``/metrics`` summed over its
two workers, and a scheduler restart the front survives."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from harness import Cluster, launch, wait_http
from llmfleet.supervisor import free_port

KEY = "sk-front-0001"
LIMITED = "sk-front-limited"
RATE = 1.0  # requests/s of the limited key (burst 2)


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> tuple[Cluster, str]:
    root = tmp_path_factory.mktemp("front")
    keys = root / "keys.yaml"
    keys.write_text(
        f"keys:\n  - {{name: team, key: {KEY}}}\n"
        f"  - {{name: limited, key: {LIMITED}, limits: {{requests_per_s: {RATE}, burst: 2}}}}\n"
    )
    c = launch(root, engines=1, placement_replicas=1, scheduler_args=("--api-keys", str(keys)))
    try:
        port = free_port()
        c.start(
            "front", "llmfleet-front", "--http-port", str(port), "--workers", "2", "--api-keys", str(keys)
        )
        c.wait_healthy(["front"])
        base = f"http://127.0.0.1:{port}"
        wait_http(base, timeout_s=30)
        yield c, base
    finally:
        c.stop()


def client(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def test_completion_and_streamed_chat(front):
    _, base = front
    oa = client(base)
    assert "chat" in [m.id for m in oa.models.list()]
    r = oa.completions.create(model="chat", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage is not None
    assert r.usage.completion_tokens == 5 and r.choices[0].text
    pieces, finish = [], None
    for chunk in oa.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) and finish == "length"


def test_wrong_key_is_401_and_bad_field_is_400_naming_it(front):
    _, base = front
    with pytest.raises(openai.AuthenticationError) as e:
        client(base, "sk-wrong").completions.create(model="chat", prompt="hi", max_tokens=2)
    assert e.value.status_code == 401
    with pytest.raises(openai.BadRequestError) as bad:  # checked by the scheduler, mapped by the front
        client(base).completions.create(model="chat", prompt="hi", max_tokens=2, top_p=1.5)
    assert bad.value.status_code == 400 and "top_p" in str(bad.value)
    assert bad.value.body["param"] == "top_p"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as prio:  # the key's max_priority, at the scheduler
        client(base).completions.create(model="chat", prompt="hi", max_tokens=2, extra_body={"priority": 3})
    assert prio.value.body["param"] == "priority" and "API key" in str(prio.value)  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(base).completions.create(model="nope", prompt="hi", max_tokens=2)


def test_the_keys_rate_limit_holds_through_the_front(front):
    _, base = front
    oa, other = client(base, LIMITED), client(base)
    admitted = refused = 0
    retry_after = None
    for _ in range(8):
        try:
            oa.completions.create(model="chat", prompt="hi", max_tokens=1)
            admitted += 1
        except openai.RateLimitError as e:
            refused += 1
            retry_after = e.response.headers.get("retry-after")
    assert refused >= 4 and admitted <= 2 + 8 * RATE, (admitted, refused)
    assert retry_after is not None and int(retry_after) >= 1
    other.completions.create(model="chat", prompt="hi", max_tokens=1)  # another key is not limited


def _metrics_url(c: Cluster, role: str) -> str:
    url = re.search(r"metrics on (http://\S+/metrics)", c.log(role))
    assert url is not None, f"the {role} logged no /metrics address"
    return url.group(1)


def _cancelled(c: Cluster) -> float:
    """The scheduler's count of requests ended cancelled (its /metrics, at the address it logged)."""
    text = httpx.get(_metrics_url(c, "scheduler"), timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmfleet_scheduler_requests_total{") and 'outcome="cancelled"' in line
    )


def test_a_client_that_leaves_mid_stream_cancels_its_request(front):
    c, base = front
    before = _cancelled(c)
    with httpx.stream(
        "POST", f"{base}/v1/completions", headers={"authorization": f"Bearer {KEY}"},
        json={"model": "chat", "prompt": "hi", "max_tokens": 2000, "stream": True}, timeout=30,
    ) as r:  # fmt: skip
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while _cancelled(c) <= before:
        assert time.monotonic() < deadline, "the request ran on after its client left"
        time.sleep(0.1)
    r2 = client(base).completions.create(model="chat", prompt="hi", max_tokens=2)
    assert r2.usage is not None and r2.usage.completion_tokens == 2


def _front_metrics(c: Cluster) -> dict[str, float]:
    """The front's ``llmfleet_front_*`` samples (its parent's /metrics: the workers' sum)."""
    text = httpx.get(_metrics_url(c, "front"), timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("llmfleet_front_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_the_fronts_metrics_count_every_request_over_both_workers(front):
    c, base = front
    files = re.search(r"the workers' metrics files in (\S+)", c.log("front"))
    assert files is not None
    before = _front_metrics(c)
    n = 20  # a client, so a connection, each: the kernel spreads them over the two workers
    tokens = 0
    for _ in range(n):
        with client(base) as oa:
            r = oa.completions.create(model="chat", prompt="Once upon a time", max_tokens=2)
            assert r.usage is not None
            tokens += r.usage.completion_tokens
    with client(base) as oa:
        for chunk in oa.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True,
            stream_options={"include_usage": True},
        ):  # fmt: skip
            if chunk.usage is not None:
                tokens += chunk.usage.completion_tokens
        with pytest.raises(openai.NotFoundError):
            oa.completions.create(model="nope", prompt="hi", max_tokens=2)
    after = _front_metrics(c)

    def grew(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    completions, chat = 'route="/v1/completions"', 'route="/v1/chat/completions"'
    assert grew(f'llmfleet_front_requests_total{{{completions},status="200"}}') == n
    assert grew(f'llmfleet_front_requests_total{{{completions},status="404"}}') == 1
    assert grew(f'llmfleet_front_requests_total{{{chat},status="200"}}') == 1
    assert grew(f"llmfleet_front_ttfb_seconds_count{{{completions}}}") == n + 1
    assert grew(f"llmfleet_front_ttfb_seconds_count{{{chat}}}") == 1
    assert grew("llmfleet_front_tokens_streamed_total") == tokens
    assert after[f"llmfleet_front_streams_open{{{chat}}}"] == 0
    assert after["llmfleet_front_submit_many_calls"] >= 1  # the key's call on the scheduler, per worker
    # both workers counted: each wrote counters of its own (2^-19: the chance that the 20 connections
    # all went to one worker)
    writers = {p.name for p in Path(files.group(1)).glob("counter_*.db")}
    assert len(writers) == 2, writers


def test_the_front_survives_a_scheduler_restart(front):
    c, base = front
    c.procs.kill("scheduler")
    c.procs.respawn("scheduler")
    c.wait_healthy(["scheduler"])
    deadline, last = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        try:
            r = client(base).completions.create(model="chat", prompt="hi", max_tokens=2)
            assert r.usage is not None and r.usage.completion_tokens == 2
            break
        except (openai.APIStatusError, openai.APIConnectionError) as e:
            last = e
            time.sleep(0.5)
    else:
        raise AssertionError(f"no completion through the front after the restart: {last!r}")
    assert c.procs["front"].alive
