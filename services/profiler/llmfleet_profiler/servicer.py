"""gRPC shell over a length predictor: protobuf <-> dataclasses, validation, nothing else."""

from __future__ import annotations

import grpc
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.predict import LengthPredictor, LengthQuery

MAX_BATCH = 4096


class ProfilerServicer(profiler_pb2_grpc.ProfilerServicer):
    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor

    async def Predict(self, request: profiler_pb2.PredictRequest, context: grpc.aio.ServicerContext):
        if len(request.items) > MAX_BATCH:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"items: at most {MAX_BATCH} per call")
        out = profiler_pb2.PredictResponse()
        for i, item in enumerate(request.items):
            if not item.service:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"items[{i}].service is required")
            p = self.predictor.predict(LengthQuery(item.service, item.prompt, item.prompt_tokens))
            out.predictions.add(
                request_id=item.request_id,
                mean_output_tokens=p.mean,
                std_output_tokens=p.std,
                observations=p.observations,
                predictor=p.predictor,
            )
        return out

    async def Observe(self, request: profiler_pb2.ObserveRequest, context: grpc.aio.ServicerContext):
        if len(request.items) > MAX_BATCH:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"items: at most {MAX_BATCH} per call")
        for i, item in enumerate(request.items):
            if not item.service:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"items[{i}].service is required")
        # Validate the whole batch first so a bad item rejects the call without a partial update.
        for item in request.items:
            self.predictor.observe(LengthQuery(item.service, "", item.prompt_tokens), item.output_tokens)
        return profiler_pb2.ObserveResponse(accepted=len(request.items))
