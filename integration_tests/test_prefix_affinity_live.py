"""prefix_affinity live: the scheduler hands the policy each request's prompt, so a prompt continuing
one that an engine served goes back to that engine while both are idle (join-the-shortest-queue would
take engine-0, the smaller id, every time); a conversation named by its session (the SDK's
``session``, the OpenAI body's ``session``) goes back to its engine though its prompts share nothing;
and a concurrent burst of one prefix spreads over both engines (the load book counts what was sent
since the last report)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import urllib.request
from collections import Counter

import openai
import pytest
from harness import BIN, launch
from llmfleet.client import AsyncClient
from llmfleet.supervisor import free_port
from llmfleet.workload.conversations import conversations, users

ENGINES = {"engine-0": {"models": ["tiny-llama"]}, "engine-1": {"models": ["tiny-llama"]}}
CONFIG = {
    "services": {
        "s-prefix": {
            "model": "tiny-llama",
            "dispatch": {"policy": "prefix_affinity", "options": {"max_load_excess": 2}},
            "max_tokens": 4,
        },
    },
    "models": {"tiny-llama": {"source": "{endless}"}},  # no EOS: every request runs to max_tokens
    "engines": ENGINES,
}
A = "alpha " * 120  # 720 bytes: two full 256-byte chunks
B = "bravo " * 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    port = free_port()
    c = launch(
        tmp_path_factory.mktemp("prefix-affinity"),
        config=CONFIG,
        placement_replicas=1,
        scheduler_args=("--http-port", str(port)),
    )
    c.http = f"http://127.0.0.1:{port}"
    yield c
    c.stop()


async def test_continuations_follow_their_prefix_and_a_burst_spreads(cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        # sent together: one goes to engine-0 (a tie), the other to engine-1 (the first is pending there)
        first = await asyncio.gather(*(client.complete(p, service="s-prefix") for p in (A, B)))
        where = {p: r.usage.engine_id for p, r in zip((A, B), first, strict=True)}
        assert sorted(where.values()) == ["engine-0", "engine-1"]
        # one at a time, both engines idle: each continuation goes where its prefix is
        for prompt in (B, A, A, B):
            done = await client.complete(prompt + "more words", service="s-prefix")
            assert done.usage.engine_id == where[prompt], (prompt[:12], done.usage.engine_id)
        # a burst of one new prefix: the load bound (2) moves it on, then it spreads by load
        burst = await asyncio.gather(
            *(
                client.complete("charlie " * 100 + f"q{i}", service="s-prefix", max_tokens=64)
                for i in range(16)
            )
        )
        share = Counter(r.usage.engine_id for r in burst)
        assert set(share) == {"engine-0", "engine-1"} and max(share.values()) <= 11, share


async def test_a_session_returns_to_its_engine_over_grpc_and_http(cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        # short prompts (under one 256-byte chunk): nothing to match but the session. Conversations
        # start two at a time until one runs on each engine (a pair splits unless a stale load
        # report still counts an earlier test's requests: on a loaded machine the burst's reports can
        # lag by seconds, so the pairs are a second apart)
        where: dict[str, str] = {}
        for k in range(20):
            pair = (f"c{k}-a", f"c{k}-b")
            first = await asyncio.gather(
                *(client.complete(f"hello {s}", service="s-prefix", session=s) for s in pair)
            )
            where.update({s: r.usage.engine_id for s, r in zip(pair, first, strict=True)})
            if len(set(where.values())) == 2:
                break
            await asyncio.sleep(1.0)
        assert set(where.values()) == {"engine-0", "engine-1"}, where
        on = {e: s for s, e in where.items()}
        a, b = on["engine-0"], on["engine-1"]
        # one at a time on idle engines, join-the-shortest-queue would take engine-0 every time
        for i, s in enumerate((b, a, b, b)):
            done = await client.complete(f"turn {i} of {s}", service="s-prefix", session=s)
            assert done.usage.engine_id == where[s], (s, done.usage.engine_id)
    # the OpenAI front door carries it in the body (extra_body); the HTTP API names no engine, so
    # the engine is read from the scheduler's per-engine dispatch counts before and after
    http = openai.AsyncOpenAI(base_url=f"{cluster.http}/v1", api_key="unused", max_retries=0, timeout=60)
    async with http:
        for s in (b, b, a):
            before = dispatched(cluster)
            await http.completions.create(
                model="s-prefix", prompt=f"via http {s}", max_tokens=2, extra_body={"session": s}
            )
            after = dispatched(cluster)
            assert {e for e in after if after[e] != before.get(e, 0)} == {where[s]}, (s, before, after)


def dispatched(cluster) -> dict[str, float]:
    """Requests the scheduler dispatched so far, per engine (its /metrics)."""
    url = re.search(r"metrics on (http://\S+/metrics)", cluster.log("scheduler")).group(1)
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    pattern = r'llmfleet_scheduler_dispatch_total\{engine="([^"]+)",service="s-prefix"\} (\S+)'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, body)}


def load(cluster, out, *workload: str) -> dict:
    """``llmfleet load`` of ``workload`` flags on the cluster's ``s-prefix`` service: its run's report."""
    run = subprocess.run(
        [
            str(BIN / "llmfleet"), "load", *workload, "--services", "s-prefix", "--etcd", cluster.etcd.endpoint,
            "--prefix", cluster.prefix, "--scheduler", cluster.scheduler, "--out", str(out), "--report-s", "2",
            "--no-plots",
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((out / "report.json").read_text())["runs"][0]


def test_llmfleet_load_replays_conversations(cluster, tmp_path):
    run = load(
        cluster, tmp_path / "live", "--conversations", "6", "--rate", "3", "--mean-turns", "3", "--think-s", "0.5",
        "--system-prompt-tokens", "40", "--max-context", "400",
    )  # fmt: skip
    # the tiny model's tokenizer splits a word w<k> into about 3 tokens; its context is 2,048
    n = len(conversations(6, rate=3.0, mean_turns=3.0, think_s=0.5, system_tokens=40, max_context=400))
    assert run["overall"]["completed"] == n > 6 and run["overall"]["failed"] == 0


def test_llmfleet_load_replays_a_closed_population_of_users(cluster, tmp_path):
    """``--users``: each of 3 users opens its next conversation a think time after its last answer, for
    4 s of earliest times; every turn of every chain is sent and completes (a new conversation resends
    only its own history, within the model's context)."""
    run = load(
        cluster, tmp_path / "users", "--users", "3", "--span", "4", "--mean-turns", "2", "--think-s", "0.5",
        "--system-prompt-tokens", "40", "--max-context", "400",
    )  # fmt: skip
    w = users(3, span_s=4.0, mean_turns=2.0, think_s=0.5, system_tokens=40, max_context=400)
    assert len({r.session for r in w}) > 3  # some user holds more than one conversation
    assert run["overall"]["completed"] == len(w) and run["overall"]["failed"] == 0
    assert "3 users for 4 s" in (tmp_path / "users" / "report.md").read_text()
