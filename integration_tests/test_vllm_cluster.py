"""The vLLM backend through the whole path, on this machine's CPU (vLLM's CPU build, `make setup-vllm`).

One cluster for the module (a vLLM engine's start costs about a minute on 2 cores): etcd, the
scheduler (gRPC and the OpenAI HTTP API), one placement leader, the migration coordinator, a vLLM
engine ``vllm-0`` and a native engine ``native-0``, both serving ``vtiny``: a tiny random Mistral
(vLLM's CPU attention needs a head size that is a multiple of 32) without EOS, so greedy runs always
reach ``max_tokens``. vLLM runs it in float32, so both engines' greedy tokens equal HF ``generate``'s.

Covered: SDK and OpenAI completions (stream, non-stream, stop strings, ``max_tokens``, usage, cancel)
served by the vLLM engine; the load it reports (vLLM's own numbers, and its prefix cache's size from
vLLM's KV-cache events, on a ``kv_events_config`` the cluster file gives, as the migration
coordinator's load monitor reads it); bad input; a drain of a request
off the vLLM engine when placement takes the model away (token transfer to the native engine), its
unload and its reload from etcd; kill -9 of the vLLM engine mid-stream (every token exactly once).
Destructive tests come last.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import psutil
import pytest
import zmq
from harness import TTL_S, Cluster, launch
from llmfleet.client import AsyncClient
from llmfleet.client.aio import GenerateStream
from llmfleet.client.errors import InvalidArgument, NotFound
from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient
from llmfleet.coord.desired import put_placement
from llmfleet.load.monitor import report_from_proto
from llmfleet.supervisor import free_port
from llmfleet.token_estimate import approx_token_count
from llmfleet.types import DesiredPlacement
from llmfleet_engine.models import materialize, without_eos
from llmfleet_engine.vllm_compat import import_vllm, kv_event_decoder
from llmfleet_engine.vllm_kv_events import user_endpoints
from util import flatten, hf_greedy, load_snapshot, migration_status, wait_running
from vllm_marks import VLLM_DEVICE, VLLM_TINY_SOURCE, requires_vllm

pytestmark = [pytest.mark.integration, *requires_vllm]

MODEL = "vtiny"
VLLM = "vllm-0"
NATIVE = "native-0"
PROMPT = "Once upon a time there was a fleet of models"
MAX_MODEL_LEN = 2048
LONG_TOKENS = 2000  # still running when a test acts on it mid-stream (prompt + 2,000 < max_model_len)
# vLLM's KV events as a user feeding an external indexer configures them (TCP on every interface, a
# topic); the node counts its prefix cache from them too
KV_EVENTS = {
    "enable_kv_cache_events": True,
    "endpoint": f"tcp://*:{free_port()}",
    "replay_endpoint": f"tcp://*:{free_port()}",
    "topic": "vtiny-kv",
}
VLLM_SETTINGS = {
    "kv_cache_memory_bytes": "256MiB",
    "max_model_len": MAX_MODEL_LEN,
    "enforce_eager": True,
    "dtype": "float32",
    "engine_args": {"kv_events_config": KV_EVENTS},
}
LOAD_TIMEOUT_S = 600  # a vLLM start on a busy 2-core machine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("vllm-models")
    return without_eos(materialize(VLLM_TINY_SOURCE, models), models / "endless-mistral")


@pytest.fixture(scope="module")
def vcluster(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[Cluster]:
    http = free_port()
    config = {
        "services": {"chat": {"model": MODEL, "max_tokens": 32}},
        "models": {MODEL: {"source": str(checkpoint)}},
        "engines": {
            VLLM: {"backend": "vllm", "models": [MODEL], "device": VLLM_DEVICE, "vllm": VLLM_SETTINGS},
            NATIVE: {"models": [MODEL]},
        },
    }
    c = launch(
        tmp_path_factory.mktemp("vllm-cluster"),
        config=config,
        placement_replicas=1,
        scheduler_args=("--http-port", str(http)),
        engine_args=("--drain-mode", "migrate"),
        load_timeout_s=LOAD_TIMEOUT_S,
    )
    c.http = f"http://127.0.0.1:{http}/v1"  # type: ignore[attr-defined]
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> list[int]:
    return hf_greedy(checkpoint, PROMPT, LONG_TOKENS)


@pytest.fixture
async def client(vcluster: Cluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(vcluster.scheduler, timeout_s=120) as c:
        yield c


def openai_client(c: Cluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=c.http, api_key="unused", max_retries=0, timeout=120)  # type: ignore[attr-defined]


def engine_node(c: Cluster, engine_id: str) -> dict:
    return next(n for n in c.status()["nodes"] if n["node_id"] == engine_id)


def scheduler_metrics_url(c: Cluster) -> str:
    """The scheduler's /metrics URL, from its log."""
    return re.search(r"metrics on (http://\S+/metrics)", c.log("scheduler")).group(1)


async def until_on(engine_id: str, attempt, tries: int = 8):
    """Run ``attempt()`` (a request that reports its engine) until ``engine_id`` served one; the
    dispatch policy alternates between the two engines."""
    results = []
    for _ in range(tries):
        result = await attempt()
        results.append(result)
        if result[0] == engine_id:
            return result, results
    raise AssertionError(f"no request reached {engine_id} in {tries} tries: {[r[0] for r in results]}")


async def test_the_vllm_engine_reports_vllms_kv_capacity(vcluster: Cluster) -> None:
    assert engine_node(vcluster, VLLM)["models"] == [MODEL]
    status = await migration_status(vcluster.addresses["migration"])
    load = next(e.load for e in status.engines if e.engine_id == VLLM)
    # 256 MiB of vLLM KV cache, counted in vLLM's blocks (128 tokens of 1 KiB each here) but the
    # null block vLLM keeps
    assert 128 * 1024 <= 256 * 2**20 - load.kv_capacity_bytes < 2 * 128 * 1024, load
    assert load.running == 0 and load.kv_used_bytes == 0, load


async def test_sdk_streams_and_completions_equal_hf_on_both_engines(
    vcluster: Cluster, client: AsyncClient, reference: list[int]
) -> None:
    counted: dict[str, int] = {}  # engine -> the prompt's tokens as it counted them

    async def stream() -> tuple[str, list[int]]:
        s = client.generate(PROMPT, service="chat", max_tokens=24)
        chunks = [c async for c in s]
        assert s.usage.finish_reason == "length" and s.usage.completion_tokens == 24
        # the engine's own TTFT (its backend's first-token time) is part of the scheduler's
        assert 0 < s.usage.engine_ttft_s <= s.usage.ttft_s, s.usage
        counted[s.usage.engine_id] = s.usage.prompt_tokens
        return s.usage.engine_id, flatten(chunks)

    async def complete() -> tuple[str, list[int]]:
        r = await client.complete(PROMPT, service="chat", max_tokens=24)
        return r.usage.engine_id, list(r.token_ids)

    for attempt in (stream, complete):
        _, results = await until_on(VLLM, attempt)
        await until_on(NATIVE, attempt)
        for engine_id, tokens in results:
            assert tokens == reference[:24], engine_id
    # both backends' counts of the prompt scale the scheduler's estimate for the model
    assert counted[VLLM] == counted[NATIVE] > 0, counted
    body = urllib.request.urlopen(scheduler_metrics_url(vcluster), timeout=5).read().decode()
    scale = float(
        re.search(rf'llmfleet_scheduler_prompt_token_scale\{{model="{MODEL}"\}} (\S+)', body).group(1)
    )
    assert scale == pytest.approx(counted[VLLM] / approx_token_count(PROMPT)), (scale, counted)


async def test_the_cluster_sees_the_blocks_vllm_caches(vcluster: Cluster, client: AsyncClient) -> None:
    """vLLM's KV-cache events reach the cluster's load monitor: a prompt of three full blocks (vLLM's
    128 tokens here) served by the vLLM engine raises the prefix-cache size its load report gives
    cache-aware dispatch. The events are the user's ``kv_events_config`` (``engine_args``): an external
    subscriber, as llm-d's indexer, receives them on its topic as well."""
    prompt = " ".join(["fleet"] * (3 * 128 + 40))  # one token per word on the tiny tokenizer, after BOS
    ctx = zmq.Context()
    indexer = ctx.socket(zmq.SUB)
    indexer.setsockopt(zmq.SUBSCRIBE, KV_EVENTS["topic"].encode())
    where = user_endpoints(KV_EVENTS)
    assert where is not None
    indexer.connect(where.publish)
    await asyncio.sleep(0.5)  # its subscription takes hold before the prompt is sent

    async def size() -> int:
        status = await migration_status(vcluster.addresses["migration"])
        report = report_from_proto(next(e.load for e in status.engines if e.engine_id == VLLM))
        assert report.prefix_cached_bytes is not None, "the vLLM engine reports its cache's size"
        return report.prefix_cached_bytes

    before = await size()

    async def complete() -> tuple[str, object]:
        r = await client.complete(prompt, service="chat", max_tokens=4)
        return r.usage.engine_id, r

    await until_on(VLLM, complete)
    block_bytes = 128 * 1024  # 128 tokens of 1 KiB of KV each (see the capacity test)
    deadline = time.monotonic() + 60
    while await size() < before + 3 * block_bytes:
        assert time.monotonic() < deadline, "the vLLM engine's cached blocks never reached the load report"
        await asyncio.sleep(0.2)
    decode = kv_event_decoder(import_vllm())
    stored = 0
    try:
        while indexer.poll(1000):  # what it has received, and what is still on its way
            topic, _, payload = indexer.recv_multipart()
            assert topic == KV_EVENTS["topic"].encode()
            batch = decode(payload)
            stored += sum(len(e.block_hashes) for e in batch.events if type(e).__name__ == "BlockStored")
    finally:
        indexer.close(linger=0)
        ctx.term()
    assert stored >= 3, "the external subscriber got the prompt's blocks too"


async def test_openai_completion_usage_max_tokens_and_stream(vcluster: Cluster) -> None:
    api = openai_client(vcluster)

    async def complete() -> tuple[str, object]:
        r = await api.completions.create(model="chat", prompt=PROMPT, max_tokens=12)
        return r.id, r

    non_stream = [await complete() for _ in range(2)]  # both engines, alternately
    texts = {r.choices[0].text for _, r in non_stream}
    assert len(texts) == 1, "the vLLM and the native engine give the same greedy text"
    for _, r in non_stream:
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    chunks = [
        c
        async for c in await api.completions.create(
            model="chat", prompt=PROMPT, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == texts.pop()
    assert chunks[-1].usage.completion_tokens == 12


async def test_stop_strings_end_completions_on_the_vllm_engine(client: AsyncClient) -> None:
    async def full() -> tuple[str, str]:
        r = await client.complete(PROMPT, service="chat", max_tokens=24)
        return r.usage.engine_id, r.text

    (_, text), _ = await until_on(VLLM, full)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"no usable stop string in {text!r}"

    async def stopped() -> tuple[str, object]:
        r = await client.complete(PROMPT, service="chat", max_tokens=24, stop=[stop])
        return r.usage.engine_id, r

    (_, r), _ = await until_on(VLLM, stopped)
    assert r.usage.finish_reason == "stop"
    assert r.text == text[: text.index(stop)]


async def test_cancelled_stream_leaves_the_vllm_engine(vcluster: Cluster, client: AsyncClient) -> None:
    stream, _, cores = await start_on_vllm(vcluster, client, tokens=4)
    cores.resume()
    await stream.cancel()
    # vLLM's own scheduler says the request is gone
    migration = vcluster.addresses["migration"]
    await wait_running(migration, lambda r: r.get(VLLM) == 0, 10, "vLLM to drop the cancelled request")


async def test_bad_input_is_refused_and_the_engine_keeps_serving(
    client: AsyncClient, vcluster: Cluster
) -> None:
    with pytest.raises(InvalidArgument, match=str(MAX_MODEL_LEN)):
        await client.complete("word " * (MAX_MODEL_LEN + 10), service="chat", max_tokens=4)
    with pytest.raises(NotFound):
        await client.complete(PROMPT, service="no-such-service", max_tokens=4)
    api = openai_client(vcluster)
    with pytest.raises(openai.BadRequestError, match=str(MAX_MODEL_LEN)):
        await api.completions.create(model="chat", prompt="word " * (MAX_MODEL_LEN + 10), max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        await api.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)

    async def ok() -> tuple[str, int]:
        r = await client.complete(PROMPT, service="chat", max_tokens=4)
        return r.usage.engine_id, r.usage.completion_tokens

    (_, n), _ = await until_on(VLLM, ok)
    assert n == 4


class HeldCores:
    """The vLLM engine's engine-core processes, stopped (SIGSTOP) so that a stream on it cannot run
    on while a test checks it and acts on it."""

    def __init__(self, vcluster: Cluster) -> None:
        self.procs = psutil.Process(vcluster.procs[VLLM].pid).children(recursive=True)
        assert self.procs, "vLLM runs its engine core in child processes"
        for p in self.procs:
            p.suspend()

    def resume(self) -> None:
        """Let them run again (those still there)."""
        for p in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()

    def kill(self) -> None:
        for p in self.procs:
            p.kill()


async def start_on_vllm(
    vcluster: Cluster, client: AsyncClient, tokens: int = 8
) -> tuple[GenerateStream, list, HeldCores]:
    """A long stream that runs on the vLLM engine, after ``tokens`` of it were read, with the vLLM
    engine core held still: (stream, chunks, held cores). The caller resumes or kills the cores.
    The dispatch alternates: a stream the vLLM engine does not report running within a few load
    reports ran on the native engine and is read to its end. vLLM-CPU runs a long stream in a few
    seconds (about 350 tokens/s here) and the leader's view comes from periodic load reports, so the
    vLLM engine core is stopped as soon as the first tokens are read; the stream is returned if the
    vLLM engine's own snapshot shows it with at least half of its tokens still to come."""
    migration = vcluster.addresses["migration"]
    for _ in range(8):
        stream = client.generate(PROMPT, service="chat", max_tokens=LONG_TOKENS)
        chunks = []
        async for c in stream:
            chunks.append(c)
            if len(flatten(chunks)) >= tokens:
                break
        cores = HeldCores(vcluster)
        try:
            await wait_running(migration, lambda r: r.get(VLLM) == 1, 5, "the stream to run on vLLM")
            await asyncio.sleep(0.5)  # the outputs the core sent before it stopped reach the node
            held = (await load_snapshot(vcluster.addresses[VLLM])).requests
            if any(r.tokens < LONG_TOKENS // 2 for r in held):
                return stream, chunks, cores
        except AssertionError:
            pass
        cores.resume()
        chunks.extend([c async for c in stream])
    raise AssertionError("no stream reached the vLLM engine")


async def assert_vllm_serves(client: AsyncClient, reference: list[int]) -> None:
    """The vLLM engine serves again, and greedily as before."""

    async def served() -> tuple[str, list[int]]:
        r = await client.complete(PROMPT, service="chat", max_tokens=8)
        return r.usage.engine_id, list(r.token_ids)

    (_, tokens), _ = await until_on(VLLM, served)
    assert tokens == reference[:8]


def assert_whole(stream, chunks: list, reference: list[int], engine_id: str) -> None:
    assert stream.usage.engine_id == engine_id and stream.usage.finish_reason == "length"
    indices = [c.index for c in chunks]
    assert indices == sorted(set(indices)), "no duplicated or reordered chunks"
    assert flatten(chunks) == reference


async def test_a_dead_vllm_engine_core_moves_its_requests_and_restarts(
    vcluster: Cluster, client: AsyncClient, reference: list[int]
) -> None:
    stream, chunks, cores = await start_on_vllm(vcluster, client)
    cores.kill()
    chunks.extend([c async for c in stream])
    assert_whole(stream, chunks, reference, NATIVE)
    assert vcluster.procs[VLLM].alive, "the engine process outlives its vLLM engine core"
    vcluster.wait_status(
        lambda s: any(n["node_id"] == VLLM and n["models"] == [MODEL] for n in s["nodes"]),
        timeout=LOAD_TIMEOUT_S,
        what="the vLLM engine to load its model again",
    )

    await assert_vllm_serves(client, reference)


# ---- destructive: placement is taken over by the test, then the vLLM engine is killed ------------


async def test_drain_moves_a_request_off_vllm_then_unloads_and_reloads(
    vcluster: Cluster, client: AsyncClient, reference: list[int]
) -> None:
    # the test plays the placement leader: it writes placement/ as the leader does
    vcluster.procs.stop("placement-0")
    etcd = EtcdClient(
        EtcdSettings(endpoints=[vcluster.etcd.endpoint], prefix=vcluster.prefix, lease_ttl_s=TTL_S)
    )
    await etcd.connect()
    raw = await etcd.get(etcd.keys.placement(VLLM))
    assert raw is not None, "the placement leader wrote the vLLM engine's placement"
    placed = DesiredPlacement.from_json(raw)
    restored = False
    try:
        stream, chunks, cores = await start_on_vllm(vcluster, client)
        try:
            # the model leaves the vLLM engine while its core is held still, so that the stream cannot
            # finish there however long the drain takes on a busy machine
            await put_placement(etcd, DesiredPlacement(VLLM, ()))
            await wait_running(
                vcluster.addresses["migration"],
                lambda r: not r.get(VLLM),
                60,
                "the drain to take the request off the vLLM engine",
            )
        finally:
            cores.resume()
        chunks.extend([c async for c in stream])
        assert_whole(stream, chunks, reference, NATIVE)
        vcluster.wait_status(
            lambda s: any(n["node_id"] == VLLM and not n["models"] for n in s["nodes"]),
            timeout=60,
            what="the vLLM engine to unload the model",
        )
        await put_placement(etcd, placed)  # and comes back
        restored = True
        vcluster.wait_status(
            lambda s: any(n["node_id"] == VLLM and n["models"] == [MODEL] for n in s["nodes"]),
            timeout=LOAD_TIMEOUT_S,
            what="the vLLM engine to load the model again",
        )
    finally:
        if not restored:  # the tests after this one find the vLLM engine serving
            await put_placement(etcd, placed)
        await etcd.close()

    await assert_vllm_serves(client, reference)


async def test_kill9_of_the_vllm_engine_mid_stream_finishes_on_the_native_one(
    vcluster: Cluster, client: AsyncClient, reference: list[int]
) -> None:
    stream, chunks, cores = await start_on_vllm(vcluster, client)
    vcluster.procs.kill(VLLM)
    cores.resume()  # any not in the engine's process group end as on a kill -9 of their engine process
    chunks.extend([c async for c in stream])
    assert_whole(stream, chunks, reference, NATIVE)
