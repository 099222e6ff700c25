"""Validation of SubmitRequest: every failure names the offending field."""

from __future__ import annotations

from llmfleet.api.v1 import common_pb2, scheduler_pb2

MAX_STOP_STRINGS = 16
MAX_PROMPT_CHARS = 1_000_000
MAX_ID_CHARS = 128  # a request id or a session (conversation) id


class InvalidField(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def validate_submit(req: scheduler_pb2.SubmitRequest) -> None:
    """Raise InvalidField for the first bad field. Limits that depend on the model (context length)
    are checked by the engine, whose INVALID_ARGUMENT is relayed unchanged."""
    if not req.service:
        raise InvalidField("service", "is required")
    if not req.prompt:
        raise InvalidField("prompt", "must not be empty")
    if len(req.prompt) > MAX_PROMPT_CHARS:
        raise InvalidField("prompt", f"longer than {MAX_PROMPT_CHARS} characters")
    if len(req.request_id) > MAX_ID_CHARS:
        raise InvalidField("request_id", f"longer than {MAX_ID_CHARS} characters")
    if len(req.session) > MAX_ID_CHARS:
        raise InvalidField("session", f"longer than {MAX_ID_CHARS} characters")
    validate_sampling(req.sampling)


def validate_sampling(s: common_pb2.SamplingParams) -> None:
    if s.HasField("max_tokens") and s.max_tokens <= 0:
        raise InvalidField("sampling.max_tokens", f"must be > 0, got {s.max_tokens}")
    if s.HasField("temperature") and not s.temperature >= 0:  # also rejects NaN
        raise InvalidField("sampling.temperature", f"must be >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise InvalidField("sampling.top_p", f"must be in (0, 1], got {s.top_p}")
    if len(s.stop) > MAX_STOP_STRINGS:
        raise InvalidField("sampling.stop", f"at most {MAX_STOP_STRINGS} stop strings")
    if any(not x for x in s.stop):
        raise InvalidField("sampling.stop", "stop strings must not be empty")
