import grpc
import pytest
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.predict import ServiceMeanPredictor
from llmfleet.rpc import GrpcServer, open_channel
from llmfleet.rpc.server import service_name
from llmfleet_profiler.servicer import ProfilerServicer


@pytest.fixture
async def stub():
    servicer = ProfilerServicer(ServiceMeanPredictor(prior_mean=5, prior_std=1))
    server = await GrpcServer(
        [(profiler_pb2_grpc.add_ProfilerServicer_to_server, servicer, service_name(profiler_pb2, "Profiler"))]
    ).start()
    async with open_channel(server.address) as ch:
        yield profiler_pb2_grpc.ProfilerStub(ch)
    await server.stop(0)


async def test_observe_updates_batched_predictions(stub):
    items = [profiler_pb2.Observation(service="chat", output_tokens=n) for n in (10, 20, 30)]
    assert (await stub.Observe(profiler_pb2.ObserveRequest(items=items))).accepted == 3
    resp = await stub.Predict(
        profiler_pb2.PredictRequest(
            items=[
                profiler_pb2.PredictItem(request_id="a", service="chat"),
                profiler_pb2.PredictItem(request_id="b", service="new"),
            ]
        )
    )
    a, b = resp.predictions
    assert (a.request_id, a.mean_output_tokens, a.observations) == ("a", 20.0, 3)
    assert a.std_output_tokens == pytest.approx(8.1649658)
    assert (b.request_id, b.mean_output_tokens, b.observations) == ("b", 5.0, 0)


async def test_missing_service_is_invalid_and_nothing_is_applied(stub):
    items = [
        profiler_pb2.Observation(service="chat", output_tokens=10),
        profiler_pb2.Observation(output_tokens=1),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Observe(profiler_pb2.ObserveRequest(items=items))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "items[1].service" in e.value.details()
    p = (
        await stub.Predict(profiler_pb2.PredictRequest(items=[profiler_pb2.PredictItem(service="chat")]))
    ).predictions[0]
    assert p.observations == 0
