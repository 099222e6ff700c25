"""The vLLM backend's pure parts, without vLLM: its settings and configuration, request -> vLLM
arguments, vLLM outputs -> chunks, and vLLM's scheduler stats -> the model's load, checked with plain
objects shaped like vLLM's (the real engine is in test_vllm_backend.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.metrics.server import samples
from llmfleet.spec.vllm import VllmSettings
from llmfleet_engine import vllm_backend as vb
from llmfleet_engine import vllm_compat as compat
from llmfleet_engine import vllm_config as vconf
from llmfleet_engine import vllm_requests as vreq
from llmfleet_engine import vllm_stats as vstats
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import FinishReason
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import build_request
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

# ------------------------------------------------------------------ plain objects shaped like vLLM's


@dataclass
class CompletionOutput:
    """Shaped like ``vllm.outputs.CompletionOutput`` (cumulative ``token_ids``)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """Shaped like ``vllm.outputs.RequestOutput``."""

    request_id: str
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: Any = None


@dataclass
class RequestStateStats:
    """Shaped like ``vllm.v1.metrics.stats.RequestStateStats`` (the timestamps the adapter reads)."""

    queued_ts: float = 0.0
    scheduled_ts: float = 0.0


@dataclass
class PrefixCacheStats:
    """Shaped like ``vllm.v1.metrics.stats.PrefixCacheStats``."""

    queries: int = 0
    hits: int = 0


@dataclass
class SchedulerStats:
    """Shaped like ``vllm.v1.metrics.stats.SchedulerStats``."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)


@dataclass
class IterationStats:
    """Shaped like ``vllm.v1.metrics.stats.IterationStats``."""

    num_preempted_reqs: int = 0


def out(
    ids: list[int],
    reason: str | None = None,
    stop_reason: int | str | None = None,
    finished: bool | None = None,
) -> RequestOutput:
    done = reason is not None if finished is None else finished
    return RequestOutput("r", [CompletionOutput(0, "", list(ids), reason, stop_reason)], done)


# ------------------------------------------------------------------ import and construction


def test_module_imports_without_vllm_and_config_defaults() -> None:
    assert vb.VllmExecutor.migration is None
    config = vb.VllmConfig()
    assert config.settings == VllmSettings()
    assert (config.device, config.tensor_parallel_size, config.max_requests) == ("cuda", 1, 4096)
    assert config.allow_download and config.cache_dir is None
    s = config.settings
    assert (s.gpu_memory_utilization, s.max_models, s.dtype, s.enforce_eager) == (0.85, 1, "auto", False)
    assert s.enable_prefix_caching and s.kv_cache_memory_bytes is None and s.max_model_len is None


def test_constructing_without_vllm_raises_backend_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, installed or not
    with pytest.raises(vb.BackendUnavailable) as info:
        vb.VllmExecutor(vb.VllmConfig(device="cpu"))
    message = str(info.value)
    assert "`make setup-vllm`" in message
    assert "ImportError" in message or "ModuleNotFoundError" in message


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0"])
def test_config_accepts_cpu_and_cuda(device: str) -> None:
    assert vb.VllmConfig(device=device).device == device


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"device": "cuda:1"}, "CUDA_VISIBLE_DEVICES"),
        ({"device": "mps"}, "device must be 'cpu' or 'cuda'"),
        ({"device": "cpu:0"}, "device must be 'cpu' or 'cuda'"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"max_requests": 0}, "max_requests"),
        ({"throughput_window_s": 0.0}, "throughput_window_s"),
    ],
)
def test_config_validation(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        vb.VllmConfig(**bad)


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 2**30),
        ("256MiB", 256 * 2**20),
        ("1.5GB", 1_500_000_000),
        (" 64 KiB ", 64 * 2**10),
        (4096, 4096),
    ],
)
def test_settings_sizes(text: str | int, expected: int) -> None:
    assert VllmSettings(kv_cache_memory_bytes=text).kv_cache_memory_bytes == expected


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"kv_cache_memory_bytes": "lots"}, "not a size: 'lots'"),
        ({"kv_cache_memory_bytes": "2TiB"}, "not a size"),
        ({"kv_cache_memory_bytes": 0}, "greater than 0"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_models": 0}, "max_models"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"dtype": "float8"}, "dtype"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"max_model_length": 512}, "max_model_length"),  # a misspelt key names itself
    ],
)
def test_settings_validation(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        VllmSettings(**bad)


def test_engine_args_may_not_set_named_settings() -> None:
    with pytest.raises(ValidationError) as info:
        VllmSettings(engine_args={"max_model_len": 512, "model": "x", "block_size": 16})
    (error,) = info.value.errors()
    assert error["loc"] == ("engine_args",)
    assert error["msg"] == (
        "Value error, engine_args may not set what a named setting sets: "
        "max_model_len (max_model_len), model (the model's source (models:))"
    )
    with pytest.raises(ValidationError, match="tensor_parallel_size"):
        VllmSettings(engine_args={"tensor_parallel_size": 2})
    with pytest.raises(ValidationError, match="scheduling_policy"):  # written once: the named setting
        VllmSettings(engine_args={"scheduling_policy": "priority"})
    assert VllmSettings(engine_args={"block_size": 16}).engine_args == {"block_size": 16}


# ------------------------------------------------------------------ settings -> engine arguments


def test_engine_kwargs_from_settings() -> None:
    settings = VllmSettings(
        kv_cache_memory_bytes="1GiB",
        gpu_memory_utilization=0.8,
        max_models=4,
        max_model_len=512,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_seqs=8,
        scheduling_policy="priority",
        engine_args={"block_size": 32, "seed": 7},
    )
    config = vb.VllmConfig(settings=settings, device="cpu", tensor_parallel_size=2)
    kwargs = vconf.engine_kwargs(config, "/models/x", "float32")
    assert kwargs == {
        "model": "/models/x",
        "tokenizer": "/models/x",
        "dtype": "float32",
        "gpu_memory_utilization": 0.2,  # the node's fraction split over max_models
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "scheduling_policy": "priority",
        "tensor_parallel_size": 2,
        "disable_log_stats": True,
        "enable_log_requests": False,
        "kv_cache_memory_bytes": 2**30,
        "max_model_len": 512,
        "max_num_seqs": 8,
        "block_size": 32,
        "seed": 7,
    }


def test_engine_kwargs_leave_unset_settings_to_vllm() -> None:
    kwargs = vconf.engine_kwargs(
        vb.VllmConfig(settings=VllmSettings(gpu_memory_utilization=0.9, max_models=3)), "m", "auto"
    )
    assert not {"kv_cache_memory_bytes", "max_model_len", "max_num_seqs"} & kwargs.keys()
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["enable_prefix_caching"] is True
    assert kwargs["enforce_eager"] is False and kwargs["tensor_parallel_size"] == 1
    assert kwargs["scheduling_policy"] == "fcfs"  # as today: arrival order


def test_vllm_priority_is_llmfleets_negated_under_priority_scheduling_only() -> None:
    # llmfleet runs the higher priority first, vLLM the lower value: the order is kept, reversed in sign
    high, low = vreq.vllm_priority(5, "priority"), vreq.vllm_priority(-2, "priority")
    assert (high, low) == (-5, 2) and high < low
    assert vreq.vllm_priority(0, "priority") == 0
    assert vreq.vllm_priority(5, "fcfs") == vreq.vllm_priority(-2, "fcfs") == 0  # arrival order: none passed


def test_engine_dtype() -> None:
    assert vconf.engine_dtype("float32") == "auto"  # ModelSpec's default: unspecified
    assert vconf.engine_dtype(None) == "auto"
    assert vconf.engine_dtype("bfloat16") == "bfloat16"
    assert vconf.engine_dtype("float16") == "float16"
    assert vconf.engine_dtype("float16", "float32") == "float32"  # the configured dtype wins


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
        "ignore_eos": True,  # vLLM's EOS is the tokenizer's; the model's EOS ids stop it instead
        "stop_token_ids": [],
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
    assert vreq.sampling_kwargs(SamplingConfig(max_tokens=2), eos_token_ids={9, 2})["stop_token_ids"] == [
        2,
        9,
    ]
    with pytest.raises(ValueError, match="nothing left to generate"):
        vreq.sampling_kwargs(SamplingConfig(max_tokens=3), resumed=3)


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
def test_map_finish_reason(reason: str | None, stop_reason: int | str | None, expected: FinishReason) -> None:
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
    assert vreq.output_delta(RequestOutput("r", [], False), 0) == vreq.OutputDelta((), 0, None)


def _steps(assembler: vreq.CompletionAssembler, outputs: list[RequestOutput]) -> list[vreq.Step]:
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


def test_engine_queue_time_from_request_stats() -> None:
    assert compat.engine_queue_s(RequestStateStats(queued_ts=50.0, scheduled_ts=50.5)) == pytest.approx(0.5)
    assert compat.engine_queue_s(RequestStateStats(queued_ts=50.0)) is None  # not scheduled yet
    assert compat.engine_queue_s(RequestStateStats(queued_ts=50.5, scheduled_ts=50.0)) == 0.0
    assert compat.engine_queue_s(None) is None


# ------------------------------------------------------------------ vLLM's scheduler stats -> load


def test_model_stats_record_scheduler_and_iteration_stats() -> None:
    registry = CollectorRegistry()
    stats = vstats.ModelStats("m", EngineMetrics(registry))
    assert stats.view() == vstats.SchedulerView()
    stats.record(
        SchedulerStats(2, 3, 1, 0.25, PrefixCacheStats(queries=300, hits=0)),
        IterationStats(num_preempted_reqs=1),
    )
    assert stats.view() == vstats.SchedulerView(
        running=2, waiting=4, kv_usage=0.25, prefix_queries=300, prefix_hits=0, preemptions=1, steps=1
    )
    stats.record(SchedulerStats(1, 0, 0, 0.5, PrefixCacheStats(queries=300, hits=256)), None)
    stats.record(None, IterationStats(num_preempted_reqs=2))  # iteration stats alone: the view stays
    assert stats.view() == vstats.SchedulerView(
        running=1, waiting=0, kv_usage=0.5, prefix_queries=600, prefix_hits=256, preemptions=3, steps=2
    )
    stats.record(SchedulerStats(), IterationStats())
    view = stats.view()
    assert (view.running, view.waiting, view.kv_usage, view.steps) == (0, 0, 0.0, 3)
    assert (view.prefix_queries, view.prefix_hits, view.preemptions) == (600, 256, 3)
    s = samples(registry)
    assert s['vllm:prefix_cache_queries_total{model_name="m"}'] == 600
    assert s['vllm:prefix_cache_hits_total{model_name="m"}'] == 256
    assert s['vllm:num_preemptions_total{model_name="m"}'] == 3


def test_stat_logger_feeds_model_stats() -> None:
    class Base:  # stands in for vLLM's StatLoggerBase, which the logger only subclasses
        pass

    stats = vstats.ModelStats("m", None)
    logger_cls = vstats.stat_logger_factory(Base, stats)
    assert issubclass(logger_cls, Base)
    logger = logger_cls(object(), engine_index=1)  # vLLM builds it with (vllm_config, engine_index)
    assert logger.engine_index == 1 and logger.log_engine_initialized() is None
    logger.record(SchedulerStats(num_running_reqs=3, kv_cache_usage=0.1), IterationStats(), None, 1)
    assert (stats.view().running, stats.view().kv_usage, stats.view().steps) == (3, 0.1, 1)
