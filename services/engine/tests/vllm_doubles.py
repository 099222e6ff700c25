"""Test doubles for the vLLM backend tests: objects shaped like vLLM's and a fake ``vllm`` package
whose engine decodes greedily with the tiny HF model on the CPU (see test_vllm_backend.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from llmfleet.types import ModelSpec
from transformers import AutoModelForCausalLM

LLAMA = ModelSpec(name="tiny-llama", source="tiny://llama")
QWEN2 = ModelSpec(name="tiny-qwen2", source="tiny://qwen2")


def _eid(engine: FakeAsyncLLMEngine, request_id: str) -> str:
    """The engine-side id the adapter gave ``request_id`` (``<request_id>.<n>``)."""
    (eid,) = [k for k in engine.prompts if k.rsplit(".", 1)[0] == request_id]
    return eid


# ------------------------------------------------------------------ test doubles shaped like vLLM's
# (plain dataclasses with the attribute names the adapter reads; not vLLM's classes)


@dataclass
class FakeCompletionOutput:
    """Shaped like ``vllm.outputs.CompletionOutput`` (cumulative ``token_ids``)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class FakeRequestOutput:
    """Shaped like ``vllm.outputs.RequestOutput``."""

    request_id: str
    outputs: list[FakeCompletionOutput]
    finished: bool = False
    metrics: Any = None


def out(ids, reason: str | None = None, stop_reason=None, finished: bool | None = None) -> FakeRequestOutput:
    done = reason is not None if finished is None else finished
    return FakeRequestOutput("r", [FakeCompletionOutput(0, "", list(ids), reason, stop_reason)], done)


@dataclass
class FakeAsyncEngineArgs:
    """Shaped like a recent ``AsyncEngineArgs`` (``enable_log_requests``, no ``disable_log_requests``)."""

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    disable_log_stats: bool = False
    enable_log_requests: bool = False


@dataclass
class FakeSamplingParams:
    """Shaped like ``vllm.SamplingParams`` (the fields the adapter sets)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: list[str] = field(default_factory=list)
    detokenize: bool = True
    skip_special_tokens: bool = True


class FakeAsyncLLMEngine:
    """Stands in for vLLM's async engine: greedy decoding with the HF checkpoint on the CPU, streaming
    cumulative outputs (EOS included with finish_reason "stop", like vLLM); ignores stop strings."""

    instances: ClassVar[list[FakeAsyncLLMEngine]] = []
    step_delay_s: ClassVar[float] = 0.0

    def __init__(self, args: FakeAsyncEngineArgs) -> None:
        self.args = args
        self.hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        self.eos = {self.hf.config.eos_token_id}
        self.model_config = SimpleNamespace(max_model_len=args.max_model_len or 2048, dtype=torch.float32)
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=100, block_size=16))
        self.prompts: dict[str, list[int]] = {}
        self.params: dict[str, FakeSamplingParams] = {}
        self.aborted: list[str] = []
        self.shutdown_calls = 0
        FakeAsyncLLMEngine.instances.append(self)

    @classmethod
    def from_engine_args(cls, args: FakeAsyncEngineArgs) -> FakeAsyncLLMEngine:
        return cls(args)

    async def generate(self, prompt: dict, sampling_params: FakeSamplingParams, request_id: str):
        ids = list(prompt["prompt_token_ids"])
        self.prompts[request_id], self.params[request_id] = list(ids), sampling_params
        completion: list[int] = []
        while True:
            await asyncio.sleep(self.step_delay_s)
            if request_id in self.aborted:
                return
            with torch.inference_mode():
                token = int(self.hf(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            completion.append(token)
            reason = None
            if token in self.eos:
                reason = "stop"
            elif len(completion) >= sampling_params.max_tokens:
                reason = "length"
            yield FakeRequestOutput(
                request_id, [FakeCompletionOutput(0, "", list(completion), reason)], bool(reason)
            )
            if reason:
                return

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self) -> None:
        self.shutdown_calls += 1
