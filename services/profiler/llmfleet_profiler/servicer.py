"""gRPC shell over a length predictor: protobuf <-> dataclasses, validation, nothing else."""

from __future__ import annotations

import grpc
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.predict import LengthPredictor, LengthQuery

from llmfleet_profiler.characterize import CharacterizeError, Characterizer

MAX_BATCH = 4096


class InvalidItem(ValueError):
    pass


class ProfilerServicer(profiler_pb2_grpc.ProfilerServicer):
    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        self.characterizer: Characterizer | None = None  # set once etcd is reached

    def _predict(self, request: profiler_pb2.PredictRequest) -> profiler_pb2.PredictResponse:
        """Validate, then predict the whole batch (one encoder pass for batched predictors)."""
        if len(request.items) > MAX_BATCH:
            raise InvalidItem(f"items: at most {MAX_BATCH} per call")
        for i, item in enumerate(request.items):
            if not item.service:
                raise InvalidItem(f"items[{i}].service is required")
        queries = [
            LengthQuery(item.service, item.prompt, item.prompt_tokens, generated_tokens=item.generated_tokens)
            for item in request.items
        ]
        many = getattr(self.predictor, "predict_many", None)
        predictions = many(queries) if many is not None else [self.predictor.predict(q) for q in queries]
        out = profiler_pb2.PredictResponse()
        for item, p in zip(request.items, predictions, strict=True):
            out.predictions.add(
                request_id=item.request_id,
                mean_output_tokens=p.mean,
                std_output_tokens=p.std,
                observations=p.observations,
                predictor=p.predictor,
                quantiles=list(p.quantiles),
                bucket_probs=list(p.bucket_probs),
                bucket_edges=list(p.buckets),
            )
        return out

    async def Predict(self, request: profiler_pb2.PredictRequest, context: grpc.aio.ServicerContext):
        try:
            return self._predict(request)
        except InvalidItem as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def PredictStream(self, request_iterator, context: grpc.aio.ServicerContext):
        async for request in request_iterator:
            try:
                yield self._predict(request)
            except InvalidItem as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def Characterize(
        self, request: profiler_pb2.CharacterizeRequest, context: grpc.aio.ServicerContext
    ):
        return await self._cost(context, lambda c: c.run(request))

    async def GetProfile(self, request: profiler_pb2.GetProfileRequest, context: grpc.aio.ServicerContext):
        return await self._cost(context, lambda c: c.get(request))

    async def _cost(self, context: grpc.aio.ServicerContext, call):
        if self.characterizer is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "profiler is not connected to etcd yet; retry")
        try:
            return await call(self.characterizer)
        except CharacterizeError as e:
            await context.abort(e.code, str(e))

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
