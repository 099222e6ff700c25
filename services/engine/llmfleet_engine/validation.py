"""Validation of generate requests against the loaded models, producing ``GenerationRequest``s.

``validate_generate`` takes the protobuf request; ``build_request`` takes plain values (tests, tools
and the simulator use it). Both raise ``UnknownModelError`` (-> NOT_FOUND) or ``ValidationError``
(-> INVALID_ARGUMENT) whose message names the offending field and the limit.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmfleet.api.v1 import engine_pb2
from llmfleet.spec.defaults import DEFAULT_MAX_TOKENS

from llmfleet_engine.models import LoadedModel
from llmfleet_engine.sampling import SamplingConfig

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "GenerationRequest",
    "UnknownModelError",
    "ValidationError",
    "build_request",
    "new_request_id",
    "validate_generate",
]


class ValidationError(ValueError):
    """A request field is invalid; ``field`` is its dotted name, e.g. ``sampling.max_tokens``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModelError(LookupError):
    """The request names a model this engine has not loaded."""

    def __init__(self, model: str, loaded: Sequence[str] = ()) -> None:
        super().__init__(f"model {model!r} is not loaded on this engine; loaded: {sorted(loaded)}")
        self.model = model


@dataclass(frozen=True)
class GenerationRequest:
    """A validated, tokenized request ready for the executor."""

    request_id: str
    model: str
    prompt: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingConfig
    resume_token_ids: tuple[int, ...] = ()
    arrival_s: float = field(default_factory=time.monotonic)  # when it entered the executor (tokenized)
    received_s: float | None = None  # when the engine received it, before tokenizing; None: arrival_s
    service: str = ""  # budget group for the local policy; empty means the model name
    predicted_output_tokens: float | None = None  # the scheduler's length prediction, if any
    deadline_s: float | None = None  # relative SLO deadline (seconds after arrival), if any
    batch_id: str = ""  # a static batch the scheduler formed (the `given` batching policy), if any
    batch_size: int = 0
    priority: int = 0  # higher runs first, preempting lower ones (the scheduler's resolved priority)
    tenant: str = ""  # the API key's name ("" none): preemption shares the engine's slots among tenants

    @property
    def since_s(self) -> float:
        """What the request's TTFT and latency count from: its receipt, before the prompt was tokenized
        (vLLM's arrival time), or its arrival where no receipt was stamped (migrated in)."""
        return self.arrival_s if self.received_s is None else self.received_s

    @property
    def group(self) -> str:
        return self.service or self.model

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def new_request_id() -> str:
    return uuid.uuid4().hex


def build_request(
    model: LoadedModel,
    prompt: str,
    *,
    request_id: str = "",
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    resume_token_ids: Sequence[int] = (),
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    arrival_s: float | None = None,
    received_s: float | None = None,
    service: str = "",
    predicted_output_tokens: float | None = None,
    deadline_s: float | None = None,
    batch_id: str = "",
    batch_size: int = 0,
    priority: int = 0,
    tenant: str = "",
) -> GenerationRequest:
    """Validate plain request values against ``model`` and tokenize the prompt.

    ``max_tokens`` counts ``resume_token_ids``; unset it defaults to ``default_max_tokens`` capped to
    the context left after the prompt. ``temperature`` defaults to 0 (greedy), ``top_p`` to 1.0.
    """
    prompt_ids = _prompt_ids(model, prompt)
    max_tokens = _max_tokens(model, len(prompt_ids), max_tokens, default_max_tokens)
    sampling = _sampling(max_tokens, temperature, top_p, seed, stop)
    if bool(batch_id) != (batch_size > 0):
        raise ValidationError("batch_size", f"must be > 0 exactly when batch_id is set, got {batch_size}")
    resume = tuple(int(t) for t in resume_token_ids)
    if len(resume) > max_tokens:
        raise ValidationError(
            "resume_token_ids", f"has {len(resume)} tokens, more than max_tokens ({max_tokens})"
        )
    if any(t < 0 or t >= model.vocab_size for t in resume):
        raise ValidationError("resume_token_ids", f"token ids must be in [0, {model.vocab_size})")
    return GenerationRequest(
        request_id=request_id or new_request_id(),
        model=model.name,
        prompt=prompt,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        resume_token_ids=resume,
        arrival_s=time.monotonic() if arrival_s is None else arrival_s,
        received_s=received_s,
        service=service,
        predicted_output_tokens=_positive("predicted_output_tokens", predicted_output_tokens),
        deadline_s=_positive("deadline_s", deadline_s),
        batch_id=batch_id,
        batch_size=batch_size,
        priority=int(priority),
        tenant=tenant,
    )


def _prompt_ids(model: LoadedModel, prompt: str) -> tuple[int, ...]:
    """The prompt's token ids: not empty, inside the vocabulary, leaving room in the context."""
    if not prompt:
        raise ValidationError("prompt", "must not be empty")
    prompt_ids = tuple(int(t) for t in model.tokenizer(prompt)["input_ids"])
    n_prompt = len(prompt_ids)
    if not prompt_ids:
        raise ValidationError("prompt", "encodes to no tokens")
    if max(prompt_ids) >= model.vocab_size:
        raise ValidationError(
            "prompt", f"encodes to token ids outside the model vocabulary ({model.vocab_size})"
        )
    if model.max_context - n_prompt <= 0:
        raise ValidationError(
            "prompt", f"has {n_prompt} tokens, at or over the model context limit of {model.max_context}"
        )
    return prompt_ids


def _max_tokens(model: LoadedModel, n_prompt: int, max_tokens: int | None, default: int) -> int:
    """The output cap: ``max_tokens`` checked against the context left, or ``default`` capped to it."""
    room = model.max_context - n_prompt
    if max_tokens is None:
        return min(default, room)
    if max_tokens <= 0:
        raise ValidationError("sampling.max_tokens", f"must be > 0, got {max_tokens}")
    if max_tokens > room:
        raise ValidationError(
            "sampling.max_tokens",
            f"{max_tokens} plus {n_prompt} prompt tokens exceeds the context limit of {model.max_context} "
            f"(at most {room} for this prompt)",
        )
    return max_tokens


def _sampling(
    max_tokens: int, temperature: float | None, top_p: float | None, seed: int | None, stop: Sequence[str]
) -> SamplingConfig:
    """The sampling settings, checked: temperature 0 (greedy) and top_p 1.0 unless given."""
    temperature = 0.0 if temperature is None else float(temperature)
    if math.isnan(temperature) or temperature < 0:
        raise ValidationError("sampling.temperature", f"must be >= 0, got {temperature}")
    top_p = 1.0 if top_p is None else float(top_p)
    if math.isnan(top_p) or not 0 < top_p <= 1:
        raise ValidationError("sampling.top_p", f"must be in (0, 1], got {top_p}")
    if any(not s for s in stop):
        raise ValidationError("sampling.stop", "stop strings must not be empty")
    return SamplingConfig(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=tuple(stop)
    )


def _positive(field_name: str, v: float | None) -> float | None:
    """None/0 → None (unset); otherwise a finite positive float."""
    if not v:
        return None
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise ValidationError(field_name, f"must be a finite number >= 0, got {v}")
    return v


def validate_generate(
    request: engine_pb2.GenerateRequest,
    models: Mapping[str, LoadedModel],
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    arrival_s: float | None = None,
    received_s: float | None = None,
) -> GenerationRequest:
    """Validate a protobuf ``GenerateRequest`` against the loaded ``models``. The request keeps the
    name it was sent with where ``models`` maps it to another model (a LoRA adapter to its base)."""
    if not request.model:
        raise ValidationError("model", "must name a loaded model")
    model = models.get(request.model)
    if model is None:
        raise UnknownModelError(request.model, list(models))
    s = request.sampling
    built = build_request(
        model,
        request.prompt,
        request_id=request.request_id,
        max_tokens=s.max_tokens if s.HasField("max_tokens") else None,
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None,
        seed=s.seed if s.HasField("seed") else None,
        stop=list(s.stop),
        resume_token_ids=list(request.resume_token_ids),
        default_max_tokens=default_max_tokens,
        arrival_s=arrival_s,
        received_s=received_s,
        service=request.service,
        predicted_output_tokens=request.predicted_output_tokens,
        deadline_s=request.deadline_s,
        batch_id=request.batch_id,
        batch_size=request.batch_size,
        priority=request.priority,
        tenant=request.tenant,
    )
    return built if model.name == request.model else replace(built, model=request.model)
