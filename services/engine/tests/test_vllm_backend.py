"""The vLLM backend adapter.

Without vLLM (this machine): the module imports, the executor refuses to start with the install hint,
the pure mappings (request -> vLLM arguments, vLLM outputs -> chunks, version branches) are checked
with plain objects shaped like vLLM's, and the executor machinery (threads, streaming, cancel,
unload, snapshot) runs against a *fake* ``vllm`` package whose engine decodes greedily with the tiny
HF model on the CPU. The last test runs the real vLLM on a GPU host and is skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from llmfleet.api.v1 import engine_pb2
from llmfleet.types import ModelSpec
from llmfleet_engine import vllm_backend as vb
from llmfleet_engine import vllm_compat as compat
from llmfleet_engine import vllm_config as vconf
from llmfleet_engine import vllm_models as vmodels
from llmfleet_engine import vllm_requests as vreq
from llmfleet_engine.models import LoadedModel, ModelLoadError, load_model
from llmfleet_engine.outputs import (
    DuplicateRequestError,
    EngineChunk,
    ExecutorClosedError,
    FinishReason,
    ModelConflictError,
)
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import UnknownModelError, build_request, validate_generate
from transformers import AutoModelForCausalLM

LLAMA = ModelSpec(name="tiny-llama", source="tiny://llama")
QWEN2 = ModelSpec(name="tiny-qwen2", source="tiny://qwen2")


def _ids(chunks: list[EngineChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def _text(chunks: list[EngineChunk]) -> str:
    return "".join(c.text for c in chunks)


def _check_stream(chunks: list[EngineChunk], start: int = 0) -> None:
    """Indices are contiguous from ``start``; only the last chunk is final and carries usage."""
    expected = start
    for c in chunks:
        assert c.index == expected
        expected += len(c.token_ids)
    assert chunks[-1].final and chunks[-1].usage is not None
    assert not any(c.final or c.usage for c in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == expected


def _eid(engine: FakeAsyncLLMEngine, request_id: str) -> str:
    """The engine-side id the adapter gave ``request_id`` (``<request_id>.<n>``)."""
    (eid,) = [k for k in engine.prompts if k.rsplit(".", 1)[0] == request_id]
    return eid


async def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


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


@pytest.fixture
def fake_vllm(monkeypatch) -> type[FakeAsyncLLMEngine]:
    """Install a fake ``vllm`` package (just the modules the adapter imports)."""
    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.engine": types.ModuleType("vllm.engine"),
        "vllm.engine.arg_utils": types.ModuleType("vllm.engine.arg_utils"),
        "vllm.engine.async_llm_engine": types.ModuleType("vllm.engine.async_llm_engine"),
        "vllm.sampling_params": types.ModuleType("vllm.sampling_params"),
    }
    modules["vllm"].__version__ = "0.0.0+fake"
    modules["vllm.engine.arg_utils"].AsyncEngineArgs = FakeAsyncEngineArgs
    modules["vllm.engine.async_llm_engine"].AsyncLLMEngine = FakeAsyncLLMEngine
    modules["vllm.sampling_params"].SamplingParams = FakeSamplingParams
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    FakeAsyncLLMEngine.instances.clear()
    monkeypatch.setattr(FakeAsyncLLMEngine, "step_delay_s", 0.0)
    return FakeAsyncLLMEngine


@pytest.fixture
def make_vllm_executor(fake_vllm, cache_dir):
    made: list[vb.VllmExecutor] = []

    def make(**overrides: Any) -> vb.VllmExecutor:
        config = dataclasses.replace(vb.VllmConfig(cache_dir=cache_dir, allow_download=False), **overrides)
        executor = vb.VllmExecutor(config)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()


@pytest.fixture
def vexec(make_vllm_executor) -> vb.VllmExecutor:
    executor = make_vllm_executor()
    executor.load(LLAMA)
    return executor


# ------------------------------------------------------------------ import and construction


def test_module_imports_without_vllm() -> None:
    assert vb.VllmExecutor.supports_kv_transfer is False
    config = vb.VllmConfig()
    assert (config.device, config.gpu_memory_utilization, config.max_model_len) == ("cuda", 0.85, None)
    assert (config.enforce_eager, config.dtype, config.tensor_parallel_size) == (False, "auto", 1)
    assert config.allow_download and config.cache_dir is None


def test_constructing_without_vllm_raises_backend_unavailable(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(vb.BackendUnavailable) as info:
        vb.VllmExecutor(vb.VllmConfig())
    message = str(info.value)
    assert message.startswith("the vLLM backend needs `pip install -e .[vllm]` on a CUDA host: ")
    assert "ImportError" in message or "ModuleNotFoundError" in message


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_memory_utilization": 0},
        {"gpu_memory_utilization": 1.5},
        {"max_models": 0},
        {"max_model_len": 0},
        {"dtype": "float8"},
        {"tensor_parallel_size": 0},
        {"memory_accounting": "shared"},
        {"device": "cuda:1"},
        {"device": "cpu"},
    ],
)
def test_config_validation(bad: dict) -> None:
    with pytest.raises(ValueError):
        vb.VllmConfig(**bad)


# ------------------------------------------------------------------ request -> vLLM arguments


def test_engine_prompt_appends_resumed_tokens(llama: LoadedModel) -> None:
    req = build_request(llama, "The quick brown fox", max_tokens=8, resume_token_ids=[7, 8])
    assert vreq.engine_prompt(req) == {"prompt_token_ids": [*req.prompt_token_ids, 7, 8]}
    plain = build_request(llama, "The quick brown fox", max_tokens=8)
    assert vreq.engine_prompt(plain) == {"prompt_token_ids": list(plain.prompt_token_ids)}


def test_sampling_kwargs_greedy_sampled_and_resumed() -> None:
    greedy = vreq.sampling_kwargs(SamplingConfig(max_tokens=10, temperature=0.0, top_p=0.5, seed=3))
    assert greedy == {
        "n": 1,
        "max_tokens": 10,
        "stop": [],
        "detokenize": False,
        "skip_special_tokens": True,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": None,
    }
    sampled = vreq.sampling_kwargs(
        SamplingConfig(max_tokens=10, temperature=0.7, top_p=0.9, seed=5, stop=("\n", "END")), resumed=4
    )
    assert sampled["max_tokens"] == 6
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.7, 0.9, 5)
    assert sampled["stop"] == ["\n", "END"] and sampled["detokenize"] is True
    with pytest.raises(ValueError):
        vreq.sampling_kwargs(SamplingConfig(max_tokens=3), resumed=3)


def test_supported_kwargs_drops_only_unknown_optional_keys() -> None:
    kwargs = vconf.engine_kwargs(vb.VllmConfig(max_model_len=512), "/models/x", "auto", 0.4)
    args = FakeAsyncEngineArgs(**compat.supported_kwargs(FakeAsyncEngineArgs, kwargs))
    assert (args.model, args.tokenizer, args.dtype, args.max_model_len) == (
        "/models/x",
        "/models/x",
        "auto",
        512,
    )
    assert args.gpu_memory_utilization == 0.4 and args.disable_log_stats and not args.enable_log_requests

    @dataclass
    class OldArgs:  # shaped like AsyncEngineArgs up to ~0.10 (disable_log_requests)
        model: str
        disable_log_requests: bool = False

    kept = compat.supported_kwargs(
        OldArgs, {"model": "m", "disable_log_requests": True, "enable_log_requests": False}
    )
    assert kept == {"model": "m", "disable_log_requests": True}
    # a required key the class does not know is passed on, so vLLM reports it
    assert compat.supported_kwargs(OldArgs, {"model": "m", "dtype": "auto"}) == {
        "model": "m",
        "dtype": "auto",
    }

    class Struct:  # shaped like a msgspec struct (SamplingParams since 0.6)
        __struct_fields__ = ("max_tokens", "temperature")

    assert compat.supported_kwargs(Struct, {"max_tokens": 1, "detokenize": False}) == {"max_tokens": 1}
    extra = vconf.engine_kwargs(vb.VllmConfig(extra_engine_args={"max_num_seqs": 8}), "m", "auto", 0.5)
    assert extra["max_num_seqs"] == 8 and "max_model_len" not in extra


def test_engine_dtype() -> None:
    assert vconf.engine_dtype("float32") == "auto"  # ModelSpec's default: unspecified on a GPU
    assert vconf.engine_dtype(None) == "auto"
    assert vconf.engine_dtype("bfloat16") == "bfloat16"
    assert vconf.engine_dtype("float16", "float32") == "float32"  # the configured dtype wins


def test_memory_fraction_and_accounting_branches() -> None:
    assert vconf.engine_memory_fraction(0.8, 2, 0, cumulative=False) == pytest.approx(0.4)
    assert vconf.engine_memory_fraction(0.8, 2, 1, cumulative=False) == pytest.approx(0.4)
    assert vconf.engine_memory_fraction(0.8, 2, 1, cumulative=True) == pytest.approx(0.8)
    assert vconf.engine_memory_fraction(0.8, 4, 5, cumulative=True) == pytest.approx(0.8)
    assert compat.parse_version("0.6.4.post1") == (0, 6, 4)
    assert compat.parse_version("0.10.1rc2+cu128") == (0, 10, 1)
    assert not compat.uses_cumulative_memory_accounting("0.6.3", v1_engine=False)
    assert compat.uses_cumulative_memory_accounting("0.6.4.post1", v1_engine=False)
    assert compat.uses_cumulative_memory_accounting("0.7.3", v1_engine=False)
    assert not compat.uses_cumulative_memory_accounting("0.7.3", v1_engine=True)
    assert not compat.uses_cumulative_memory_accounting("0.11.0", v1_engine=True)


# ------------------------------------------------------------------ vLLM outputs -> chunks


@pytest.mark.parametrize(
    ("reason", "stop_reason", "expected"),
    [
        (None, None, None),
        ("length", None, FinishReason.LENGTH),
        ("stop", None, FinishReason.EOS),  # vLLM: stop with no stop_reason is the EOS token
        ("stop", 128009, FinishReason.EOS),  # an extra EOS id from the generation config
        ("stop", "\n\n", FinishReason.STOP),  # a stop string
        ("abort", None, FinishReason.CANCELLED),
        ("error", None, FinishReason.ERROR),
        ("repetition", "repetition_detected", FinishReason.STOP),
        ("something-new", None, FinishReason.STOP),
    ],
)
def test_map_finish_reason(reason, stop_reason, expected) -> None:
    assert vreq.map_finish_reason(reason, stop_reason) is expected


def test_output_delta_from_cumulative_outputs() -> None:
    assert vreq.output_delta(out([5, 6]), 0) == vreq.OutputDelta((5, 6), 2, None)
    assert vreq.output_delta(out([5, 6, 7, 8]), 2) == vreq.OutputDelta((7, 8), 4, None)
    assert vreq.output_delta(out([5, 6]), 2) == vreq.OutputDelta((), 2, None)
    assert vreq.output_delta(out([5]), 2) == vreq.OutputDelta((), 2, None)  # never goes backwards
    # EOS is in vLLM's token_ids but never emitted
    assert vreq.output_delta(out([5, 6, 1], "stop"), 2, {1}) == vreq.OutputDelta((), 3, FinishReason.EOS)
    assert vreq.output_delta(out([5, 9], "stop", 9), 1, {1}) == vreq.OutputDelta((), 2, FinishReason.EOS)
    assert vreq.output_delta(out([5, 6, 7], "stop", "xy"), 1) == vreq.OutputDelta(
        (6, 7), 3, FinishReason.STOP
    )
    assert vreq.output_delta(out([5], "length"), 0) == vreq.OutputDelta((5,), 1, FinishReason.LENGTH)
    assert vreq.output_delta(out([5], finished=True), 0).finish_reason is FinishReason.STOP
    assert vreq.output_delta(FakeRequestOutput("r", [], False), 0) == vreq.OutputDelta((), 0, None)


def _steps(assembler: vreq.CompletionAssembler, outputs) -> list[vreq.Step]:
    steps = []
    for o in outputs:
        step = assembler.feed(o)
        if step is not None:
            assembler.commit(step)
            steps.append(step)
    return steps


def _cumulative(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """Cumulative prefixes of ``ids`` growing by ``sizes`` (vLLM may batch tokens per output)."""
    prefixes, n = [], 0
    for size in sizes:
        n += size
        prefixes.append(ids[:n])
    return prefixes


def test_assembler_indices_and_text(llama: LoadedModel) -> None:
    ids = llama.tokenizer("héllo wörld, 日本語 🙂 and more text", add_special_tokens=False)["input_ids"]
    n = len(ids)
    req = build_request(llama, "Say:", max_tokens=n)
    assembler = vreq.CompletionAssembler(req, llama.tokenizer, llama.eos_token_ids)
    sizes = [1, 2, 1, 3] + [1] * (n - 7)
    prefixes = _cumulative(ids, sizes)
    outputs = [out(p) for p in prefixes[:-1]] + [out(prefixes[-1], "length")]
    steps = _steps(assembler, [*outputs[:2], out(prefixes[1]), *outputs[2:]])  # a repeat adds nothing
    assert [s.index for s in steps] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert [t for s in steps for t in s.token_ids] == ids
    assert all(s.finish_reason is None for s in steps[:-1]) and steps[-1].finish_reason is FinishReason.LENGTH
    assert "".join(s.text for s in steps) == llama.tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in s.text for s in steps)
    assert assembler.tokens == ids


def test_assembler_eos_is_not_emitted(llama: LoadedModel) -> None:
    ids = llama.tokenizer(" the cat sat", add_special_tokens=False)["input_ids"]
    eos = next(iter(llama.eos_token_ids))
    req = build_request(llama, "Say:", max_tokens=50)
    assembler = vreq.CompletionAssembler(req, llama.tokenizer, llama.eos_token_ids)
    steps = _steps(assembler, [out(ids[:1]), out([*ids, eos], "stop")])
    assert steps[-1].finish_reason is FinishReason.EOS
    assert steps[-1].token_ids == tuple(ids[1:]) and assembler.tokens == ids
    assert "".join(s.text for s in steps) == llama.tokenizer.decode(ids)
    alone = vreq.CompletionAssembler(req, llama.tokenizer, llama.eos_token_ids)
    final = _steps(alone, [out(ids), out([*ids, eos], "stop")])[-1]
    assert (final.index, final.token_ids, final.finish_reason) == (len(ids), (), FinishReason.EOS)


def test_assembler_resume_continues_indices_and_text(llama: LoadedModel) -> None:
    ids = llama.tokenizer("naïve café — 日本語 text goes on", add_special_tokens=False)["input_ids"]
    n = len(ids)
    full = _steps(
        vreq.CompletionAssembler(build_request(llama, "Say:", max_tokens=n), llama.tokenizer),
        [out(ids[:i]) for i in range(1, n)] + [out(ids, "length")],
    )
    for k in range(1, n):  # every split, including inside multi-byte characters
        req = build_request(llama, "Say:", max_tokens=n, resume_token_ids=ids[:k])
        assembler = vreq.CompletionAssembler(req, llama.tokenizer)
        assert assembler.initial_finish is None
        rest = ids[k:]  # vLLM's completion after the re-prefill of prompt + resumed ids
        steps = _steps(assembler, [out(rest[:i]) for i in range(1, len(rest))] + [out(rest, "length")])
        assert steps[0].index == k and [t for s in steps for t in s.token_ids] == rest
        assert steps[-1].finish_reason is FinishReason.LENGTH and assembler.tokens == ids
        delivered = "".join(s.text for s in full[:k])
        assert delivered + "".join(s.text for s in steps) == "".join(s.text for s in full)


def test_assembler_stop_string_inside_a_delta(llama: LoadedModel) -> None:
    text = " the cat sat on the mat and the dog ran"
    ids = llama.tokenizer(text, add_special_tokens=False)["input_ids"]
    req = build_request(llama, "Say:", max_tokens=50, stop=["mat"])
    steps = _steps(vreq.CompletionAssembler(req, llama.tokenizer), [out(ids)])  # one batched output
    (step,) = steps
    assert step.finish_reason is FinishReason.STOP
    assert step.text == " the cat sat on the "
    emitted = list(step.token_ids)
    assert emitted == ids[: len(emitted)] and len(emitted) < len(ids)
    assert "mat" in llama.tokenizer.decode(emitted) and "mat" not in llama.tokenizer.decode(emitted[:-1])


def test_assembler_engine_stop_flushes_held_text(llama: LoadedModel) -> None:
    ids = llama.tokenizer(" the cat sat", add_special_tokens=False)["input_ids"]
    req = build_request(llama, "Say:", max_tokens=50, stop=["sat!"])  # " sat" is held back as a prefix
    steps = _steps(vreq.CompletionAssembler(req, llama.tokenizer), [out(ids[:-1]), out(ids, "stop", "zzz")])
    assert steps[-1].finish_reason is FinishReason.STOP
    assert "".join(s.text for s in steps) == " the cat sat"


def test_assembler_caps_at_max_tokens_and_handles_abort(llama: LoadedModel) -> None:
    ids = llama.tokenizer(" one two three four five six", add_special_tokens=False)["input_ids"]
    req = build_request(llama, "Say:", max_tokens=3)
    (step,) = _steps(vreq.CompletionAssembler(req, llama.tokenizer), [out(ids)])  # engine over-generates
    assert step.token_ids == tuple(ids[:3]) and step.finish_reason is FinishReason.LENGTH
    assert step.text == llama.tokenizer.decode(ids[:3])
    aborted = _steps(vreq.CompletionAssembler(req, llama.tokenizer), [out(ids[:1]), out(ids[:1], "abort")])
    assert aborted[-1].finish_reason is FinishReason.CANCELLED and aborted[-1].token_ids == ()


def test_assembler_initial_finish(llama: LoadedModel) -> None:
    ids = llama.tokenizer(" the cat sat", add_special_tokens=False)["input_ids"]
    stopped = build_request(llama, "Say:", max_tokens=20, stop=["cat"], resume_token_ids=ids)
    assert vreq.CompletionAssembler(stopped, llama.tokenizer).initial_finish is FinishReason.STOP
    full = build_request(llama, "Say:", max_tokens=len(ids), resume_token_ids=ids)
    assert vreq.CompletionAssembler(full, llama.tokenizer).initial_finish is FinishReason.LENGTH
    open_ = build_request(llama, "Say:", max_tokens=len(ids) + 1, resume_token_ids=ids)
    assert vreq.CompletionAssembler(open_, llama.tokenizer).initial_finish is None


def test_engine_queue_time_from_metrics() -> None:
    v0 = SimpleNamespace(arrival_time=1000.0, first_scheduled_time=1000.25)  # RequestMetrics
    v1 = SimpleNamespace(queued_ts=50.0, scheduled_ts=50.5)  # RequestStateStats
    assert compat.engine_queue_s(v0) == pytest.approx(0.25)
    assert compat.engine_queue_s(v1) == pytest.approx(0.5)
    assert compat.engine_queue_s(SimpleNamespace(arrival_time=1000.0, first_scheduled_time=None)) is None
    assert compat.engine_queue_s(None) is None


# ------------------------------------------------------------------ engine facts and shutdown branches


def test_engine_facts_v0_and_v1_shapes() -> None:
    v1 = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=4096, dtype=torch.bfloat16),
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=1000, block_size=16)),
    )
    facts = compat.engine_facts(v1)
    assert (facts.max_model_len, facts.dtype, facts.num_gpu_blocks, facts.block_size) == (
        4096,
        "bfloat16",
        1000,
        16,
    )
    v0 = SimpleNamespace(
        engine=SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=2048, dtype=torch.float16),
            cache_config=SimpleNamespace(num_gpu_blocks=None, block_size=16),
        )
    )
    facts = compat.engine_facts(v0)
    assert (facts.max_model_len, facts.dtype, facts.num_gpu_blocks, facts.v1) == (
        2048,
        "float16",
        None,
        False,
    )
    assert compat.engine_facts(object()) == compat.EngineFacts(False, None, None, None, None)


def test_shutdown_engine_branches() -> None:
    calls: list[str] = []
    v1 = SimpleNamespace(shutdown=lambda: calls.append("v1"))
    v0 = SimpleNamespace(
        shutdown_background_loop=lambda: calls.append("loop"),
        engine=SimpleNamespace(model_executor=SimpleNamespace(shutdown=lambda: calls.append("executor"))),
    )
    assert compat.shutdown_engine(v1) == "shutdown"
    assert compat.shutdown_engine(v0) == "shutdown_background_loop"
    assert compat.shutdown_engine(object()) == "none"
    assert calls == ["v1", "loop", "executor"]


# ------------------------------------------------------------------ the executor on a fake vLLM


def test_load_reports_model_facts(vexec: vb.VllmExecutor, llama: LoadedModel) -> None:
    model = vexec.models["tiny-llama"]
    assert isinstance(model, vb.VllmLoadedModel) and isinstance(model, LoadedModel)
    engine = FakeAsyncLLMEngine.instances[-1]
    assert model.model is engine and model.path == llama.path
    assert engine.args.model == llama.path and engine.args.dtype == "auto"  # spec float32 = unspecified
    assert engine.args.gpu_memory_utilization == pytest.approx(0.85 / 2)
    assert (model.dtype, model.engine_dtype, model.memory_fraction) == (
        "float32",
        "float32",
        pytest.approx(0.425),
    )
    assert model.max_context == 2048 and model.vocab_size == llama.vocab_size
    assert model.eos_token_ids == llama.eos_token_ids
    assert model.weight_bytes == llama.weight_bytes and model.kv_bytes_per_token == llama.kv_bytes_per_token
    assert model.architecture == llama.architecture and model.spec == LLAMA
    assert vexec.kv_capacity_bytes == 100 * 16 * llama.kv_bytes_per_token
    assert vexec.backend == "vllm" and vexec.device == "cuda" and not vexec.supports_kv_transfer


def test_load_idempotent_conflict_limit_reconcile(make_vllm_executor) -> None:
    executor = make_vllm_executor(max_models=2, max_model_len=256)
    changes: list[tuple[str, ...]] = []
    executor.on_models_changed.append(changes.append)
    assert not executor.load(LLAMA).already_loaded
    assert executor.load(LLAMA).already_loaded
    assert executor.models["tiny-llama"].max_context == 256
    with pytest.raises(ModelConflictError):
        executor.load(ModelSpec(name="tiny-llama", source="tiny://qwen2"))
    executor.load(QWEN2)
    with pytest.raises(ModelLoadError, match="max_models=2"):
        executor.load(ModelSpec(name="third", source="tiny://mistral"))
    result = executor.reconcile([QWEN2, ModelSpec(name="other", source="/no/such/dir")])
    assert result.unloaded == ["tiny-llama"] and result.loaded == [] and "other" in result.errors
    assert executor.model_names() == ("tiny-qwen2",)
    assert changes == [("tiny-llama",), ("tiny-llama", "tiny-qwen2"), ("tiny-qwen2",)]
    assert FakeAsyncLLMEngine.instances[0].shutdown_calls == 1


async def test_greedy_matches_hf_through_the_adapter(
    vexec: vb.VllmExecutor, llama: LoadedModel, prompts, hf_greedy
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 16
    for i, prompt in enumerate(prompts[:4]):
        req = build_request(model, prompt, max_tokens=n, request_id=f"g{i}")
        assert req.prompt_token_ids == tuple(llama.tokenizer(prompt)["input_ids"])
        expected = hf_greedy(llama, req.prompt_token_ids, n)
        chunks = await vexec.submit(req).collect()
        _check_stream(chunks)
        assert _ids(chunks) == expected
        assert chunks[-1].finish_reason == (FinishReason.LENGTH if len(expected) == n else FinishReason.EOS)
        assert _text(chunks) == llama.tokenizer.decode(expected, skip_special_tokens=True)
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(req.prompt_token_ids)
        assert 0 <= usage.queue_s <= usage.ttft_s <= usage.latency_s
        params = engine.params[_eid(engine, f"g{i}")]
        assert (params.temperature, params.top_p, params.max_tokens, params.detokenize) == (
            0.0,
            1.0,
            n,
            False,
        )
        assert engine.prompts[_eid(engine, f"g{i}")] == list(req.prompt_token_ids)


async def test_validate_generate_works_unchanged(vexec: vb.VllmExecutor) -> None:
    proto = engine_pb2.GenerateRequest(model="tiny-llama", prompt="The quick brown fox", request_id="p1")
    proto.sampling.max_tokens = 4
    req = validate_generate(proto, vexec.models)
    chunks = await vexec.submit(req).collect()
    _check_stream(chunks)
    assert chunks[-1].usage.completion_tokens <= 4


async def test_concurrent_requests_across_models(
    make_vllm_executor, llama, qwen2, prompts, hf_greedy
) -> None:
    executor = make_vllm_executor()
    executor.load(LLAMA)
    executor.load(QWEN2)
    pairs = [
        (hf, build_request(executor.models[hf.name], p, max_tokens=12))
        for hf in (llama, qwen2)
        for p in prompts[:3]
    ]
    results = await asyncio.gather(*(executor.submit(r).collect() for _, r in pairs))
    for (hf, req), chunks in zip(pairs, results, strict=True):
        _check_stream(chunks)
        assert _ids(chunks) == hf_greedy(hf, req.prompt_token_ids, 12)


async def test_resume_re_prefills_and_continues(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 12
    prompt = long_prompt(llama, n)
    full = await vexec.submit(build_request(model, prompt, max_tokens=n)).collect()
    ids = _ids(full)
    for k in (1, 5, n - 1):
        req = build_request(model, prompt, max_tokens=n, resume_token_ids=ids[:k], request_id=f"res{k}")
        resumed = await vexec.submit(req).collect()
        _check_stream(resumed, start=k)
        assert _ids(resumed) == ids[k:]
        assert resumed[-1].finish_reason == FinishReason.LENGTH and resumed[-1].usage.completion_tokens == n
        assert "".join(c.text for c in full[:k]) + _text(resumed) == _text(full)
        assert engine.prompts[_eid(engine, f"res{k}")] == [*req.prompt_token_ids, *ids[:k]]  # token transfer
        assert engine.params[_eid(engine, f"res{k}")].max_tokens == n - k
    done = await vexec.submit(
        build_request(model, prompt, max_tokens=3, resume_token_ids=ids[:3], request_id="done")
    ).collect()
    assert len(done) == 1 and done[0].finish_reason == FinishReason.LENGTH and done[0].index == 3
    assert not any(k.startswith("done.") for k in engine.prompts)  # never reached vLLM


async def test_stop_string_ends_and_aborts_engine(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 24
    prompt = long_prompt(llama, n)
    full = await vexec.submit(build_request(model, prompt, max_tokens=n)).collect()
    text = _text(full)
    start = next(
        i
        for i in range(4, len(text) - 3)
        if "\ufffd" not in text[i : i + 3] and text.find(text[i : i + 3]) == i
    )
    stop = text[start : start + 3]
    req = build_request(model, prompt, max_tokens=n, stop=[stop], request_id="stopper")
    chunks = await vexec.submit(req).collect()
    _check_stream(chunks)
    assert chunks[-1].finish_reason == FinishReason.STOP and _text(chunks) == text[:start]
    assert _ids(chunks) == _ids(full)[: len(_ids(chunks))] and len(_ids(chunks)) < n
    params = engine.params[_eid(engine, "stopper")]
    assert params.stop == [stop] and params.detokenize
    await _wait_for(lambda: _eid(engine, "stopper") in engine.aborted)


async def test_cancel_and_closing_streams(vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt) -> None:
    FakeAsyncLLMEngine.step_delay_s = 0.05
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    prompt = long_prompt(llama, 30)
    req = build_request(model, prompt, max_tokens=30, request_id="long")
    stream = vexec.submit(req)
    first = await stream.__anext__()
    assert not first.final
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting) == (1, 0)
    (load,) = snap.models
    assert load.kv_tokens >= req.prompt_tokens + 1
    assert load.kv_used_bytes == load.kv_tokens * model.kv_bytes_per_token
    with pytest.raises(DuplicateRequestError):
        vexec.submit(build_request(model, prompt, max_tokens=5, request_id="long"))
    assert vexec.cancel("long")
    assert not vexec.cancel("long")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED and rest[-1].usage is not None
    _check_stream([first, *rest])
    await _wait_for(lambda: any(k.startswith("long.") for k in engine.aborted))
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting, snap.kv_used_bytes) == (0, 0, 0)
    FakeAsyncLLMEngine.step_delay_s = 0.0  # the same id again right away: a fresh engine-side id
    again = await vexec.submit(build_request(model, prompt, max_tokens=3, request_id="long")).collect()
    assert again[-1].finish_reason == FinishReason.LENGTH and len(_ids(again)) == 3
    assert len([k for k in engine.prompts if k.startswith("long.")]) == 2
    FakeAsyncLLMEngine.step_delay_s = 0.05

    stream = vexec.submit(build_request(model, prompt, max_tokens=30, request_id="closed"))
    await stream.__anext__()
    await stream.aclose()
    assert vexec.load_snapshot().running == 0
    await _wait_for(lambda: _eid(engine, "closed") in engine.aborted)

    stream = vexec.submit(build_request(model, prompt, max_tokens=30, request_id="reader"))
    reader = asyncio.create_task(stream.collect())
    await _wait_for(lambda: vexec.load_snapshot().running == 1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert vexec.load_snapshot().running == 0
    await _wait_for(lambda: _eid(engine, "reader") in engine.aborted)


async def test_unload_cancels_requests_and_shuts_engine_down(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    FakeAsyncLLMEngine.step_delay_s = 0.05
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    stream = vexec.submit(build_request(model, long_prompt(llama, 30), max_tokens=30, request_id="u1"))
    await stream.__anext__()
    assert await asyncio.to_thread(vexec.unload, "tiny-llama")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED
    assert engine.shutdown_calls == 1 and _eid(engine, "u1") in engine.aborted
    assert vexec.model_names() == () and vexec.kv_capacity_bytes == 0
    assert not vexec.unload("tiny-llama")
    with pytest.raises(UnknownModelError):
        vexec.submit(build_request(model, "hi", max_tokens=2))


async def test_snapshot_throughput_and_close(vexec: vb.VllmExecutor) -> None:
    model = vexec.models["tiny-llama"]
    chunks = await vexec.submit(build_request(model, "The quick brown fox", max_tokens=8)).collect()
    snap = vexec.load_snapshot()
    assert snap.tokens_per_s == pytest.approx(len(_ids(chunks)) / vexec.config.throughput_window_s)
    assert snap.kv_capacity_bytes == vexec.kv_capacity_bytes > 0
    await vexec.aclose()
    assert FakeAsyncLLMEngine.instances[-1].shutdown_calls == 1
    with pytest.raises(ExecutorClosedError):
        vexec.submit(build_request(model, "hi", max_tokens=2))
    with pytest.raises(ExecutorClosedError):
        vexec.load(LLAMA)


async def test_engine_errors_end_the_stream_with_error(vexec: vb.VllmExecutor, monkeypatch) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]

    async def broken(prompt, sampling_params, request_id):
        raise RuntimeError("engine dead")
        yield  # an async generator, like vLLM's generate

    async def silent(prompt, sampling_params, request_id):  # ends without a finished output
        yield FakeRequestOutput(request_id, [FakeCompletionOutput(0, "", [42])], False)

    for generate in (broken, silent):
        monkeypatch.setattr(engine, "generate", generate)
        chunks = await vexec.submit(build_request(model, "The quick brown fox", max_tokens=8)).collect()
        assert chunks[-1].finish_reason == FinishReason.ERROR and chunks[-1].usage is not None
        _check_stream(chunks)
    assert vexec.load_snapshot().running == 0


def test_engine_start_failure_is_a_load_error(make_vllm_executor, monkeypatch) -> None:
    def fail(args):
        raise RuntimeError("CUDA out of memory")

    executor = make_vllm_executor()
    with monkeypatch.context() as patch:
        patch.setattr(FakeAsyncLLMEngine, "from_engine_args", staticmethod(fail))
        with pytest.raises(
            ModelLoadError, match="vLLM could not start 'tiny://llama': RuntimeError: CUDA out of memory"
        ):
            executor.load(LLAMA)
    assert executor.model_names() == () and not FakeAsyncLLMEngine.instances

    def broken(config, dtype):
        raise RuntimeError("odd config")

    monkeypatch.setattr(vmodels, "_kv_bytes_per_token", broken)  # fails after the engine started
    with pytest.raises(
        ModelLoadError, match="cannot describe model 'tiny://llama': RuntimeError: odd config"
    ):
        executor.load(LLAMA)
    assert executor.model_names() == () and FakeAsyncLLMEngine.instances[-1].shutdown_calls == 1


async def test_servicer_over_the_vllm_executor(vexec: vb.VllmExecutor, llama: LoadedModel, hf_greedy) -> None:
    """The Engine gRPC service runs unchanged on this backend; KV transfer answers FAILED_PRECONDITION."""
    import grpc
    from llmfleet.api.v1 import common_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel
    from llmfleet.rpc.server import GrpcServer, service_name
    from llmfleet_engine.servicer import EngineServicer

    servicer = EngineServicer(vexec, "vllm-engine")
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()
    channel = open_channel(server.address)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        prompt = "The quick brown fox"
        request = engine_pb2.GenerateRequest(
            model="tiny-llama", prompt=prompt, sampling=common_pb2.SamplingParams(max_tokens=8)
        )
        chunks = [c async for c in stub.Generate(request)]
        assert [t for c in chunks for t in c.token_ids] == hf_greedy(
            llama, llama.tokenizer(prompt)["input_ids"], 8
        )
        assert chunks[-1].finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_EOS)
        info = await stub.GetInfo(engine_pb2.GetInfoRequest())
        assert info.backend == "vllm" and [m.name for m in info.models] == ["tiny-llama"]
        assert info.kv_capacity_bytes == vexec.kv_capacity_bytes
        snapshots = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        snapshot = await snapshots.read()
        snapshots.cancel()
        assert [m.model for m in snapshot.models] == ["tiny-llama"]
        with pytest.raises(grpc.aio.AioRpcError) as info_:
            async for _ in stub.ExportKv(engine_pb2.ExportKvRequest(request_id="x")):
                pass
        assert info_.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "re-prefill" in info_.value.details()
    finally:
        await channel.close()
        await server.stop(0)
    assert vexec.attach("anything") is None and not vexec.cancel_if_unattached("anything")


# ------------------------------------------------------------------ the real vLLM (GPU hosts only)

_REAL_VLLM = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.mark.skipif(not _REAL_VLLM, reason="needs vllm installed and a CUDA GPU")
async def test_real_vllm_tiny_model_end_to_end(cache_dir, prompts, hf_greedy) -> None:
    """Greedy output through a real vLLM engine equals HF generate (float32 on both sides), resume
    continues the same tokens, cancel and unload work. tiny://mistral has head_dim 32, a size vLLM's
    attention kernels support (the tiny llama's 16 may not be)."""
    spec = ModelSpec(name="tiny-mistral", source="tiny://mistral")
    reference = load_model(spec, cache_dir=cache_dir)
    executor = vb.VllmExecutor(
        vb.VllmConfig(
            cache_dir=cache_dir,
            dtype="float32",
            gpu_memory_utilization=0.3,
            max_models=1,
            enforce_eager=True,
            max_model_len=1024,
            allow_download=False,
        )
    )
    try:
        await asyncio.to_thread(executor.load, spec)
        model = executor.models["tiny-mistral"]
        assert model.max_context == 1024 and model.engine_dtype == "float32"
        n = 16
        for prompt in prompts[:4]:
            req = build_request(model, prompt, max_tokens=n)
            expected = hf_greedy(reference, req.prompt_token_ids, n)
            chunks = await executor.submit(req).collect()
            _check_stream(chunks)
            assert _ids(chunks) == expected
            assert _text(chunks) == reference.tokenizer.decode(expected, skip_special_tokens=True)
            if len(expected) == n and n > 4:
                resumed = await executor.submit(
                    build_request(model, prompt, max_tokens=n, resume_token_ids=expected[:4])
                ).collect()
                _check_stream(resumed, start=4)
                assert _ids(resumed) == expected[4:]
        stream = executor.submit(build_request(model, prompts[0], max_tokens=900, request_id="cancel-me"))
        await stream.__anext__()
        assert executor.cancel("cancel-me")
        assert (await stream.collect())[-1].finish_reason == FinishReason.CANCELLED
        assert executor.load_snapshot().running == 0
        assert await asyncio.to_thread(executor.unload, "tiny-mistral")
    finally:
        await executor.aclose()
