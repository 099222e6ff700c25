"""Characterize / GetProfile with a real etcd and a real (in-process) engine hosting a tiny model."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.rpc import open_channel
from llmfleet.testing import eventually
from llmfleet_engine import main as engine_main
from llmfleet_profiler import main as profiler_main

SWEEP = {
    "batch_sizes": [1, 2, 4],
    "input_lengths": [8, 16, 32, 64],
    "context_lengths": [8, 32, 64],
    "repeats": 2,
}


@pytest.fixture
async def stack(node_args, tmp_path):
    common = node_args
    engine, _ = engine_main.build_node(
        engine_main.build_parser().parse_args(
            [
                *common,
                "--id",
                "eng",
                "--models-dir",
                str(tmp_path),
                "--threads",
                "1",
                "--model",
                "m=tiny://llama",
                "--memory-budget",
                "256MiB",
            ]
        )
    )
    profiler = profiler_main.build_node(profiler_main.build_parser().parse_args([*common, "--id", "prof"]))
    await engine.start()
    await profiler.start()
    servicer = profiler.server.services[0][1]

    async def engine_ready() -> bool:
        c = servicer.characterizer
        return c is not None and "m" in getattr(c.nodes.snapshot().get("eng"), "models", ())

    await eventually(engine_ready, 60, "the profiler to see the engine with its model")
    async with open_channel(profiler.address) as ch:
        yield profiler_pb2_grpc.ProfilerStub(ch), profiler
    await profiler.stop()
    await engine.stop()


async def test_characterize_fits_and_stores_the_profile(stack):
    stub, profiler = stack
    prof = await stub.Characterize(
        profiler_pb2.CharacterizeRequest(model="m", engine_id="eng", **SWEEP), timeout=300
    )
    assert (prof.model, prof.hardware, prof.source) == ("m", "cpu", "fitted")
    assert prof.samples > 0 and {f.name for f in prof.fits} >= {"aladdin.prefill", "aladdin.decode"}
    assert all(f.rmse_s >= 0 and f.points > 0 for f in prof.fits)
    assert json.loads(prof.coefficients_json)["model"] == "m"
    stored = await profiler.etcd.get(profiler.etcd.keys.profile("m", "cpu"))
    assert stored is not None and json.loads(stored)["source"] == "fitted"
    again = await stub.GetProfile(profiler_pb2.GetProfileRequest(model="m", hardware="cpu"))
    assert again.coefficients_json == prof.coefficients_json


async def test_get_profile_falls_back_to_roofline(stack):
    stub, _ = stack
    prof = await stub.GetProfile(profiler_pb2.GetProfileRequest(model="llama2-7b", hardware="A100-80GB"))
    assert prof.source == "roofline" and prof.samples == 0
    assert json.loads(prof.coefficients_json)["source"] == "roofline"


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        (
            profiler_pb2.GetProfileRequest(model="ghost-7b", hardware="A100-80GB"),
            grpc.StatusCode.NOT_FOUND,
            "ghost-7b",
        ),
        (
            profiler_pb2.GetProfileRequest(model="llama2-7b", hardware="TPU-v9"),
            grpc.StatusCode.NOT_FOUND,
            "TPU-v9",
        ),
        (
            profiler_pb2.CharacterizeRequest(model="other", engine_id="eng"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "other",
        ),
        (profiler_pb2.CharacterizeRequest(model="m", engine_id="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        (
            profiler_pb2.CharacterizeRequest(model="m", engine_id="eng", hardware="TPU-v9"),
            grpc.StatusCode.NOT_FOUND,
            "TPU-v9",
        ),
    ],
)
async def test_bad_requests(stack, request_, code, needle):
    stub, _ = stack
    call = stub.GetProfile if isinstance(request_, profiler_pb2.GetProfileRequest) else stub.Characterize
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call(request_, timeout=60)
    assert e.value.code() == code and needle in e.value.details()
    assert e.value.details()[0] not in "'\"", e.value.details()  # a message, not a quoted KeyError


async def test_too_few_points_is_a_clear_error(stack):
    stub, _ = stack
    req = profiler_pb2.CharacterizeRequest(
        model="m", engine_id="eng", batch_sizes=[1], input_lengths=[8], context_lengths=[8], repeats=1
    )
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Characterize(req, timeout=120)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "fit" in e.value.details()


async def test_predict_stream_answers_each_batch(stack):
    stub, _ = stack
    call = stub.PredictStream()
    for n in (1, 3):
        await call.write(
            profiler_pb2.PredictRequest(
                items=[profiler_pb2.PredictItem(service="s", request_id=str(i)) for i in range(n)]
            )
        )
        resp = await asyncio.wait_for(call.read(), 10)
        assert [p.request_id for p in resp.predictions] == [str(i) for i in range(n)]
    await call.done_writing()
