"""Request validation: field-named errors, defaults and limits."""

from __future__ import annotations

import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.validation import (
    DEFAULT_MAX_TOKENS,
    UnknownModelError,
    ValidationError,
    build_request,
    validate_generate,
)


def _req(**sampling: object) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id="r1",
        model="tiny-llama",
        prompt="Hello there",
        sampling=common_pb2.SamplingParams(**sampling),
    )


def test_defaults(llama: LoadedModel) -> None:
    req = validate_generate(
        engine_pb2.GenerateRequest(model="tiny-llama", prompt="Hi"), {"tiny-llama": llama}
    )
    assert len(req.request_id) == 32 and int(req.request_id, 16) >= 0
    assert req.sampling.max_tokens == DEFAULT_MAX_TOKENS
    assert req.sampling.temperature == 0.0 and req.sampling.greedy
    assert req.sampling.top_p == 1.0 and req.sampling.seed is None
    assert req.prompt_token_ids == tuple(llama.tokenizer("Hi")["input_ids"])


def test_explicit_values(llama: LoadedModel) -> None:
    req = validate_generate(
        _req(max_tokens=5, temperature=0.5, top_p=0.9, seed=3, stop=["\n"]), {"tiny-llama": llama}
    )
    assert req.request_id == "r1"
    s = req.sampling
    assert (s.max_tokens, s.seed, s.stop) == (5, 3, ("\n",))
    assert s.temperature == pytest.approx(0.5) and s.top_p == pytest.approx(0.9)


def test_default_max_tokens_capped_to_context(llama: LoadedModel) -> None:
    prompt = "a" * (llama.max_context - 11)  # one token per "a", plus <s>
    n = len(llama.tokenizer(prompt)["input_ids"])
    assert n == llama.max_context - 10
    assert build_request(llama, prompt).sampling.max_tokens == 10


def test_unknown_model(llama: LoadedModel) -> None:
    with pytest.raises(UnknownModelError, match="nope"):
        validate_generate(engine_pb2.GenerateRequest(model="nope", prompt="x"), {"tiny-llama": llama})


@pytest.mark.parametrize(
    ("sampling", "field", "needle"),
    [
        ({"max_tokens": 0}, "sampling.max_tokens", "> 0"),
        ({"max_tokens": -3}, "sampling.max_tokens", "> 0"),
        ({"max_tokens": 5000}, "sampling.max_tokens", "2048"),
        ({"temperature": -0.1}, "sampling.temperature", ">= 0"),
        ({"top_p": 0.0}, "sampling.top_p", "(0, 1]"),
        ({"top_p": 1.5}, "sampling.top_p", "(0, 1]"),
        ({"stop": [""]}, "sampling.stop", "empty"),
    ],
)
def test_invalid_sampling(llama: LoadedModel, sampling: dict, field: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_generate(_req(**sampling), {"tiny-llama": llama})
    assert info.value.field == field
    assert field in str(info.value) and needle in str(info.value)


def test_invalid_prompt_and_resume(llama: LoadedModel) -> None:
    with pytest.raises(ValidationError, match="prompt") as info:
        build_request(llama, "")
    assert info.value.field == "prompt"
    with pytest.raises(ValidationError) as info:
        build_request(llama, "x" * 100_000, max_tokens=1)
    assert info.value.field == "prompt" and "2048" in str(info.value)
    with pytest.raises(ValidationError) as info:
        build_request(llama, "hi", max_tokens=2, resume_token_ids=[5, 6, 7])
    assert info.value.field == "resume_token_ids"
    with pytest.raises(ValidationError) as info:
        build_request(llama, "hi", resume_token_ids=[llama.vocab_size])
    assert info.value.field == "resume_token_ids"
    with pytest.raises(ValidationError) as info:
        validate_generate(engine_pb2.GenerateRequest(prompt="hi"), {"tiny-llama": llama})
    assert info.value.field == "model"
