"""Plain result types returned by the SDK (no protobuf leaks into user code)."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api.v1 import common_pb2, scheduler_pb2


@dataclass(frozen=True)
class Chunk:
    """A new piece of the completion: ``index`` is the position of ``token_ids[0]`` in the completion."""

    text: str
    token_ids: tuple[int, ...]
    index: int


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of a finished request (seconds); ``finish_reason`` is e.g. ``"length"``."""

    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    latency_s: float
    finish_reason: str
    engine_id: str
    engine_ttft_s: float = 0.0  # the engine's own TTFT (ttft_s minus this: what the path added)
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache (not computed)


@dataclass(frozen=True)
class Completion:
    """A whole completion as returned by ``complete()``."""

    text: str
    token_ids: tuple[int, ...]
    usage: Usage
    request_id: str


@dataclass(frozen=True)
class ServiceInfo:
    """A service the scheduler knows: its model, SLOs, priority and the engines hosting the model."""

    name: str
    model: str
    ttft_slo_s: float
    tpot_slo_s: float
    priority: int
    engines: tuple[str, ...]

    @classmethod
    def from_proto(cls, msg: scheduler_pb2.ServiceInfo) -> ServiceInfo:
        return cls(
            name=msg.name,
            model=msg.model,
            ttft_slo_s=msg.ttft_slo_s,
            tpot_slo_s=msg.tpot_slo_s,
            priority=msg.priority,
            engines=tuple(msg.engines),
        )


_FINISH_PREFIX = "FINISH_REASON_"


def finish_reason_name(value: int) -> str:
    """``common_pb2.FINISH_REASON_LENGTH`` -> ``"length"`` (unknown values -> ``"unknown(N)"``)."""
    try:
        name = common_pb2.FinishReason.Name(value)
    except ValueError:
        return f"unknown({value})"
    return name.removeprefix(_FINISH_PREFIX).lower()


def usage_from_chunk(chunk: common_pb2.TokenChunk, engine_id: str = "") -> Usage:
    """The :class:`Usage` carried by a final TokenChunk."""
    u = chunk.usage
    return Usage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        queue_s=u.queue_s,
        ttft_s=u.ttft_s,
        latency_s=u.latency_s,
        finish_reason=finish_reason_name(chunk.finish_reason),
        engine_id=chunk.engine_id or engine_id,
        engine_ttft_s=u.engine_ttft_s,
        cached_tokens=u.cached_tokens,
    )
