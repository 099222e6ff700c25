"""Fuzzing every gRPC method of every service against a live cluster (one engine).

Each RPC gets ``LLMFLEET_FUZZ_EXAMPLES`` Hypothesis examples (default 25; the slow ones fewer) of
requests drawn by :mod:`fuzz_strategies` from the request's descriptor: valid, boundary and invalid
values, oversized strings and bytes, unknown enum numbers. Every call must either succeed or be
refused with a clear status (INVALID_ARGUMENT naming a field, NOT_FOUND, FAILED_PRECONDITION, ...);
INTERNAL, UNKNOWN, DATA_LOSS and hangs (DEADLINE_EXCEEDED) fail the test, and after each RPC's run
every process must still be alive and answer gRPC health.

How each RPC is bounded (see ``SPECS``):
- Submit / Generate: ``sampling.max_tokens`` from a small set of valid and invalid values, so a run
  generates at most a few tokens; a call deadline catches hangs.
- WatchLoad (an endless stream): the first snapshot, then the call is cancelled.
- ImportKv / ReceiveProbe / PredictStream / ReportStats (client or bidirectional streams): a few
  generated messages; ImportKv's header often carries the real model's KV shape so imports get past
  the shape check (an imported request never attached is cancelled by the engine after 30 s).
- LoadModel: names and sources from a small set (a throwaway name, a loaded name, tiny:// sources,
  missing and non-checkpoint paths) plus fuzz; UnloadModel never names a model the cluster serves, so
  the cluster stays usable. The placement follower unloads whatever LoadModel added.
- MeasureLink: ``bytes`` at most 1 MiB (or invalid), destinations: the engine itself, a dead port,
  fuzz. Profile / Characterize: sweep sizes from a small set (0, 1, 2, huge) and fewer examples.
- ReportStats: fuzzed reports feed the placement monitor; the default (static) placement policy
  ignores them, so they cannot move models.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest
from fuzz_strategies import messages
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import Cluster, launch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmfleet.api.v1 import (
    engine_pb2,
    migration_pb2,
    placement_pb2,
    profiler_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

EXAMPLES = int(os.environ.get("LLMFLEET_FUZZ_EXAMPLES", "25"))
SLOW_EXAMPLES = max(4, EXAMPLES // 4)  # Profile, Characterize, LoadModel: real work per call

C = grpc.StatusCode
REFUSALS = {
    C.INVALID_ARGUMENT,
    C.NOT_FOUND,
    C.FAILED_PRECONDITION,
    C.OUT_OF_RANGE,
    C.RESOURCE_EXHAUSTED,
    C.ALREADY_EXISTS,
    C.UNIMPLEMENTED,
}
SERVICES = {
    "Scheduler": (scheduler_pb2, "scheduler"),
    "Engine": (engine_pb2, "engine-0"),
    "Profiler": (profiler_pb2, "profiler"),
    "Placement": (placement_pb2, "placement-0"),
    "Migration": (migration_pb2, "migration"),
}
SERVED = ("tiny-llama", "tiny-qwen2")  # what engine-0 serves: never unloaded by the fuzzer
MODELS = st.one_of(
    st.sampled_from(SERVED), st.sampled_from([*SERVED, "tiny-mistral", "", "nope"]), st.text(max_size=12)
)
MAX_TOKENS = st.one_of(st.integers(1, 4), st.sampled_from([1, 2, -1, 0, 2**31 - 1, -(2**31)]))
STOPS = st.lists(st.one_of(st.sampled_from(["", "a", "\x00", "é", "\n"]), st.text(max_size=4)), max_size=20)
# Profile sweeps: never [] or 0 repeats (the default sweep takes a minute on a loaded CI machine)
SIZES = st.lists(st.sampled_from([0, 1, 2, 3, 2**32 - 1, 100_000]), min_size=1, max_size=2)
REPEATS = st.sampled_from([1, 2, 2**32 - 1])
INT32 = st.integers(-(2**31), 2**31 - 1)


@dataclass
class Spec:
    """How to fuzz one RPC. ``requests(cluster)``: a strategy of one request (unary request) or of a
    list of requests (client streaming). ``take``: read at most this many responses, then cancel."""

    requests: Callable[[Cluster], st.SearchStrategy] | None = None  # None: the request type, fuzzed
    timeout: float = 30.0
    take: int | None = None
    also_ok: frozenset = frozenset()  # codes beyond REFUSALS that are a clear answer for this RPC
    examples: int = EXAMPLES
    names: tuple[str, ...] = field(default=())  # extra words an INVALID_ARGUMENT may name


def one(cls, overrides=None, **kw) -> Callable[[Cluster], st.SearchStrategy]:
    return lambda _c: messages(cls, overrides, **kw)


def default_requests(m: MethodDescriptor) -> st.SearchStrategy:
    """The method's request type, fuzzed; a client stream: up to 3 of them."""
    one_request = messages(message_factory.GetMessageClass(m.input_type))
    return st.lists(one_request, max_size=3) if m.client_streaming else one_request


def kv_shape(c: Cluster) -> engine_pb2.KvShape:
    cfg = json.loads((c.models_dir / "endless-llama" / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    return engine_pb2.KvShape(
        num_layers=cfg["num_hidden_layers"],
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        dtype="float32",
    )


def import_streams(c: Cluster) -> st.SearchStrategy:
    shape = kv_shape(c)
    per_token = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * 4
    header = messages(
        engine_pb2.KvTransferHeader,
        {
            "model": MODELS,
            "shape": st.one_of(st.just(shape), messages(engine_pb2.KvShape)),
            "num_tokens": st.one_of(st.sampled_from([0, 1, 4, 2**32 - 1]), st.integers(0, 64)),
            "prompt_token_ids": st.one_of(
                st.lists(st.integers(0, 300), min_size=1, max_size=8), st.lists(INT32, max_size=4)
            ),
            "generated_token_ids": st.lists(st.one_of(st.integers(0, 300), INT32), max_size=4),
            "sampling.max_tokens": MAX_TOKENS,
            "sampling.stop": STOPS,
        },
    ).map(lambda h: engine_pb2.KvChunk(header=h))
    exact = st.integers(0, 4).flatmap(
        lambda n: st.integers(0, 8).map(
            lambda start: engine_pb2.KvChunk(
                data=engine_pb2.KvData(start_token=start, num_tokens=n, data=b"\0" * (n * per_token))
            )
        )
    )
    chunks = st.lists(st.one_of(exact, messages(engine_pb2.KvChunk)), max_size=3)
    first = st.one_of(header, messages(engine_pb2.KvChunk))
    fuzzed = st.tuples(first, chunks).map(lambda t: [t[0], *t[1]])

    # a header that passes the engine's checks (token transfer: no K/V), with fuzzed token ids,
    # sampling and generator state: the request is then re-prefilled and decoded here
    def consistent_header(h: engine_pb2.KvTransferHeader, rid: str, n: int) -> list[engine_pb2.KvChunk]:
        h.request_id, h.model, h.num_tokens = rid, "tiny-llama", 0
        h.shape.CopyFrom(shape)
        h.sampling.max_tokens = n
        if not h.prompt_token_ids:
            h.prompt_token_ids.append(1)
        return [engine_pb2.KvChunk(header=h)]

    consistent = st.builds(
        consistent_header,
        messages(
            engine_pb2.KvTransferHeader,
            {
                "prompt_token_ids": st.lists(st.one_of(st.integers(0, 300), INT32), max_size=6),
                "generated_token_ids": st.lists(st.one_of(st.integers(0, 300), INT32), max_size=3),
                "sampling.stop": STOPS,
                "sampling.temperature": mostly(0.0, 1.0),
                "sampling.top_p": mostly(1.0, 0.5),
            },
            oversized=False,
        ),
        st.uuids().map(str),
        st.integers(1, 4),
    )
    return st.one_of(fuzzed, consistent)


def destinations(c: Cluster) -> st.SearchStrategy[str]:
    own = c.addresses["engine-0"]
    return st.one_of(
        st.sampled_from([own, "127.0.0.1:1", "", "localhost:0", "[::1]:1", "unix:/nonexistent"]),
        st.text(max_size=20),
    )


def mostly(*valid):
    """An override: these valid values about half the time, else the field's fuzz."""
    return lambda fuzz: st.one_of(st.sampled_from(valid), fuzz)


SAMPLING = {  # valid values mixed in, so that more requests get as far as generation
    "sampling.max_tokens": MAX_TOKENS,
    "sampling.stop": STOPS,
    "sampling.temperature": mostly(0.0, 0.7, 1.0),
    "sampling.top_p": mostly(1.0, 0.9, 0.5),
}
SUBMIT_OVERRIDES = {
    "service": st.one_of(
        st.sampled_from(["chat", "summarize"]),
        st.sampled_from(["chat", "summarize", "unplaced", "", "nope"]),
        st.text(min_size=1, max_size=8),
    ),
    "prompt": mostly("Hello", "Once upon a time", "é中文🙂"),
    "request_id": mostly(""),
    "resume_token_ids": mostly([], [1], [5, 6]),
    **SAMPLING,
}
GENERATE_OVERRIDES = {
    "model": MODELS,
    "prompt": mostly("Hello", "Once upon a time", "é中文🙂"),
    "request_id": mostly(""),
    "resume_token_ids": mostly([], [1], [5, 6]),
    "batch_id": mostly(""),
    "batch_size": mostly(0),
    **SAMPLING,
}
SWEEP = {"batch_sizes": SIZES, "input_lengths": SIZES, "context_lengths": SIZES, "repeats": REPEATS}


def commands(cmd_cls, req_cls, overrides) -> Callable[[Cluster], st.SearchStrategy]:
    """A multiplexed call's command stream: up to 3 messages of up to 3 starts (fuzzed requests,
    odd deadlines) and cancels (ids, some of the started ones)."""

    def build(starts: list, cancels: list[str]):
        msg = cmd_cls()
        for request, timeout_s in starts:
            msg.start.add(request=request, timeout_s=timeout_s)
        msg.cancel.extend(cancels)
        return msg

    def strategy(_c: Cluster) -> st.SearchStrategy:
        timeouts = st.sampled_from([0.0, 20.0, -1.0, float("nan"), float("inf"), 1e300, 1e-9])
        starts = st.lists(st.tuples(messages(req_cls, overrides), timeouts), max_size=3)
        cancels = st.lists(st.sampled_from(["", "r-1", "fuzz"]) | st.text(max_size=8), max_size=2)
        return st.lists(st.builds(build, starts, cancels), max_size=3)

    return strategy


MANY_IDS = {"request_id": st.sampled_from(["", "r-1", "r-2", "fuzz"]) | st.text(max_size=8)}

SPECS: dict[str, Spec] = {
    "Scheduler.SubmitMany": Spec(
        commands(scheduler_pb2.SubmitCommands, scheduler_pb2.SubmitRequest, {**SUBMIT_OVERRIDES, **MANY_IDS}),
        examples=SLOW_EXAMPLES * 2,
        timeout=60,
    ),
    "Engine.GenerateMany": Spec(
        commands(engine_pb2.GenerateCommands, engine_pb2.GenerateRequest, {**GENERATE_OVERRIDES, **MANY_IDS}),
        examples=SLOW_EXAMPLES * 2,
        timeout=60,
    ),
    "Scheduler.Submit": Spec(
        one(scheduler_pb2.SubmitRequest, SUBMIT_OVERRIDES), also_ok=frozenset({C.UNAVAILABLE})
    ),
    "Scheduler.Cancel": Spec(),
    "Scheduler.ListServices": Spec(),
    "Engine.Generate": Spec(one(engine_pb2.GenerateRequest, GENERATE_OVERRIDES)),
    "Engine.Cancel": Spec(),
    "Engine.LoadModel": Spec(
        one(
            engine_pb2.LoadModelRequest,
            {
                "model.name": st.one_of(
                    st.sampled_from(["fuzz-throwaway", "tiny-llama", ""]), st.text(max_size=12)
                ),
                "model.source": st.one_of(
                    st.sampled_from(
                        [
                            "",
                            "tiny://nope",
                            "tiny://",
                            "tiny://llama",
                            "/nonexistent/x",
                            "/",
                            "/etc/passwd",
                            ".",
                        ]
                    ),
                    st.text(max_size=20),
                ),
                "model.dtype": st.one_of(
                    st.sampled_from(["", "float32", "bfloat16", "float16", "int4"]), st.text(max_size=8)
                ),
            },
        ),
        examples=SLOW_EXAMPLES * 2,
        timeout=60,
    ),
    "Engine.UnloadModel": Spec(
        one(
            engine_pb2.UnloadModelRequest,
            {
                "model": st.one_of(st.just("fuzz-throwaway"), st.text(max_size=12)).filter(
                    lambda m: m not in SERVED
                )
            },
        )
    ),
    "Engine.GetInfo": Spec(),
    "Engine.WatchLoad": Spec(take=1, timeout=10),
    "Engine.ExportKv": Spec(timeout=10),
    "Engine.ImportKv": Spec(import_streams, timeout=20),
    "Engine.Migrate": Spec(
        lambda c: messages(engine_pb2.MigrateRequest, {"destination": destinations(c)}), timeout=20
    ),
    "Engine.MeasureLink": Spec(
        lambda c: messages(
            engine_pb2.MeasureLinkRequest,
            {
                "destination": destinations(c),
                "bytes": st.one_of(st.sampled_from([1, 4096, 2**30 + 1, 2**64 - 1]), st.integers(1, 1 << 20)),
            },
        ),
        also_ok=frozenset({C.ABORTED}),  # the destination could not be reached (documented)
        timeout=20,
    ),
    "Engine.ReceiveProbe": Spec(),
    "Engine.Profile": Spec(
        one(engine_pb2.ProfileRequest, {"model": MODELS, **SWEEP}), examples=SLOW_EXAMPLES, timeout=60
    ),
    "Profiler.Predict": Spec(),
    "Profiler.PredictStream": Spec(),
    "Profiler.Observe": Spec(),
    "Profiler.Characterize": Spec(
        one(
            profiler_pb2.CharacterizeRequest,
            {
                "model": MODELS,
                "engine_id": st.one_of(st.sampled_from(["engine-0", "", "nope"]), st.text(max_size=8)),
                "hardware": st.one_of(st.sampled_from(["", "cpu", "h100", "nope"]), st.text(max_size=8)),
                **SWEEP,
            },
        ),
        examples=SLOW_EXAMPLES,
        timeout=60,
    ),
    "Profiler.GetProfile": Spec(),
    "Placement.GetPlan": Spec(),
    "Placement.ReportStats": Spec(),
    "Migration.Status": Spec(),
}


def all_methods() -> list[tuple[str, MethodDescriptor]]:
    out = []
    for svc, (module, _) in SERVICES.items():
        for m in module.DESCRIPTOR.services_by_name[svc].methods:
            out.append((f"{svc}.{m.name}", m))
    return out


def field_names(d: Descriptor, seen: set[str] | None = None) -> set[str]:
    """Every field name reachable from ``d`` (what an INVALID_ARGUMENT may name)."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    if d.full_name in seen:
        return names
    seen.add(d.full_name)
    for f in d.fields:
        names.add(f.name)
        if f.message_type is not None:
            names |= field_names(f.message_type, seen)
    return names


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(tmp_path_factory.mktemp("cluster"), engines=1, placement_replicas=1)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def channels(cluster):
    out = {name: grpc.insecure_channel(addr) for name, addr in cluster.addresses.items()}
    yield out
    for ch in out.values():
        ch.close()


def invoke(
    channel: grpc.Channel, m: MethodDescriptor, request, spec: Spec
) -> tuple[grpc.StatusCode, str, int]:
    """Call ``m``; returns (status code, details, responses read)."""
    path = f"/{m.containing_service.full_name}/{m.name}"
    out_cls = message_factory.GetMessageClass(m.output_type)
    kw = {"request_serializer": lambda r: r.SerializeToString(), "response_deserializer": out_cls.FromString}
    try:
        if m.client_streaming and m.server_streaming:
            got = list(channel.stream_stream(path, **kw)(iter(request), timeout=spec.timeout))
            # a multiplexed call's per-stream statuses (ChunkBatch.errors) count like call statuses
            for end in (e for batch in got for e in getattr(batch, "errors", ())):
                code = next((c for c in C if c.value[0] == end.code), C.UNKNOWN)
                if code in (C.INTERNAL, C.UNKNOWN, C.DATA_LOSS):  # a deadline it asked for is fine
                    return code, end.details, len(got)
            return C.OK, "", len(got)
        if m.client_streaming:
            channel.stream_unary(path, **kw)(iter(request), timeout=spec.timeout)
            return C.OK, "", 1
        if m.server_streaming:
            call = channel.unary_stream(path, **kw)(request, timeout=spec.timeout)
            n = 0
            try:
                for _ in call:
                    n += 1
                    if spec.take is not None and n >= spec.take:
                        call.cancel()
                        return C.OK, "", n
            except grpc.RpcError as e:
                if spec.take is not None and n >= spec.take and e.code() == C.CANCELLED:
                    return C.OK, "", n
                raise
            return C.OK, "", n
        channel.unary_unary(path, **kw)(request, timeout=spec.timeout)
        return C.OK, "", 1
    except grpc.RpcError as e:
        return e.code(), e.details() or "", 0


def check_alive(c: Cluster) -> None:
    """Every process alive, answering gRPC health, and the cluster still serving both models."""
    dead = [f"{ch.name}: {ch!r}\n{ch.log_tail()}" for ch in c.procs.children if not ch.alive]
    assert not dead, "processes died:\n" + "\n".join(dead)
    for name, addr in c.addresses.items():
        with grpc.insecure_channel(addr) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    with grpc.insecure_channel(c.scheduler) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        for service in ("chat", "summarize"):
            req = scheduler_pb2.SubmitRequest(service=service, prompt="still serving?")
            req.sampling.max_tokens = 2
            chunks = list(stub.Submit(req, timeout=30))
            assert chunks[-1].usage.completion_tokens == 2, (service, chunks[-1])


def test_every_rpc_has_a_fuzz_spec():
    assert sorted(SPECS) == sorted(name for name, _ in all_methods())


@pytest.mark.parametrize(("name", "method"), all_methods(), ids=[n for n, _ in all_methods()])
def test_fuzz_rpc(cluster, channels, name, method):
    spec = SPECS[name]
    svc = name.split(".")[0]
    channel = channels[SERVICES[svc][1]]
    fields = field_names(method.input_type) | set(spec.names)
    outcomes: Counter[str] = Counter()
    last_details: dict[str, str] = {}

    @settings(
        max_examples=spec.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not os.environ.get("LLMFLEET_FUZZ_RANDOM"),  # CI: the same examples every run
    )
    @given(spec.requests(cluster) if spec.requests is not None else default_requests(method))
    def run(request):
        t0 = time.monotonic()
        code, details, _ = invoke(channel, method, request, spec)
        took = time.monotonic() - t0
        outcomes[code.name] += 1
        if details:
            last_details[code.name] = details[:160]
        short = details if len(details) < 300 else details[:300] + "..."
        where = f"{name} -> {code.name} ({took:.1f}s): {short!r}\nrequest: {_brief(request)}"
        assert code == C.OK or code in REFUSALS or code in spec.also_ok, where
        if code != C.OK:
            assert details.strip(), f"refusal without details: {where}"
            # the server's refusal was lost: its details were over gRPC's metadata limit
            assert "metadata size exceeds" not in details, where
        if code == C.INVALID_ARGUMENT:
            assert any(f in details for f in fields), f"INVALID_ARGUMENT names no field: {where}"

    try:
        run()
    finally:
        print(f"{name}: {dict(outcomes)} {last_details}")  # the outcome mix (pytest -s)
        check_alive(cluster)


def _brief(request) -> str:
    text = str(request) if not isinstance(request, list) else " | ".join(str(r) for r in request)
    return text if len(text) < 600 else text[:600] + f"... ({len(text)} chars)"
