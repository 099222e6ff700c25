"""The vLLM backend's pure mappings, without vLLM: request -> vLLM arguments, vLLM outputs -> chunks,
version branches, checked with plain objects shaped like vLLM's."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from llmfleet_engine import vllm_backend as vb
from llmfleet_engine import vllm_compat as compat
from llmfleet_engine import vllm_config as vconf
from llmfleet_engine import vllm_requests as vreq
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import (
    FinishReason,
)
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import build_request
from vllm_doubles import FakeAsyncEngineArgs, FakeRequestOutput, out

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
