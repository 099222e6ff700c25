"""LoRA adapters on the vLLM backend, on the real vLLM (its CPU build here): a request naming an adapter
runs on its base's vLLM engine with a ``LoRARequest``, and its greedy output equals HF ``generate`` on
the base with the adapter merged (``merge_and_unload``); a batch mixing adapters and the base gives each
row its own output; the load report lists the adapters vLLM holds (``list_loras``); a bad adapter is
refused with the native engine's words and the engine keeps serving.

One executor for the module (a vLLM start costs tens of seconds here) serving a tiny random Mistral in
float32 (vLLM's CPU attention needs a head size that is a multiple of 32) with ``max_loras`` 2, and
random PEFT adapters of it (B not zero) made in the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import chunk_checks as cc
import grpc
import pytest
import torch
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.vllm import VllmSettings
from llmfleet.types import ModelSpec
from llmfleet_engine.backend import LoraBackend
from llmfleet_engine.lora import AdapterError
from llmfleet_engine.models import materialize, tiny_config
from llmfleet_engine.servicer import EngineServicer
from llmfleet_engine.validation import GenerationRequest, UnknownModelError, build_request
from llmfleet_engine.vllm_backend import VllmConfig, VllmExecutor, VllmLoadedModel
from lora_checkpoints import ALL_LINEAR, fresh_base, hf_greedy, merged
from peft import LoraConfig, get_peft_model
from prometheus_client import CollectorRegistry, generate_latest
from transformers import AutoModelForCausalLM
from vllm_marks import VLLM_DEVICE, requires_vllm

pytestmark = [*requires_vllm, pytest.mark.timeout(600)]

BASE = "lora-mistral"
N = 16
PROMPT = "Once upon a time there was a little town by the river."
# name -> (rank, alpha, targets, rsLoRA)
ADAPTERS = {
    "qv": (4, 8, ["q_proj", "v_proj"], False),
    "all": (8, 16, ALL_LINEAR, False),
    "mlp": (2, 4, ["up_proj", "down_proj", "o_proj"], True),
}
SETTINGS = VllmSettings(
    kv_cache_memory_bytes=128 * 2**20, max_model_len=256, enforce_eager=True, dtype="float32"
)
WAIT_S = 60.0


def _adapter(base: Path, target: Path, rank: int, alpha: int, targets: list[str], rslora: bool) -> Path:
    cfg = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, init_lora_weights=False
    )
    get_peft_model(fresh_base(base), cfg).save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """The tiny Mistral base (with the tiny tokenizer's files), one directory per ``ADAPTERS`` entry,
    and bad ones: rank 16 (above the engine's 8), an adapter of another base (tiny llama) and a
    directory without its weights file."""
    root = tmp_path_factory.mktemp("vllm-lora")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        AutoModelForCausalLM.from_config(tiny_config("mistral"), dtype=torch.float32).save_pretrained(
            root / "base"
        )
        for f in Path(materialize("tiny://mistral", root / "cache")).glob("*token*"):
            shutil.copy(f, root / "base" / f.name)
        dirs = {}
        for i, (name, spec) in enumerate(ADAPTERS.items()):
            torch.manual_seed(100 + i)
            dirs[name] = _adapter(root / "base", root / name, *spec)
        dirs["rank16"] = _adapter(root / "base", root / "rank16", 16, 16, ["q_proj"], False)
        AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.float32).save_pretrained(
            root / "llama"
        )
        dirs["llama"] = _adapter(root / "llama", root / "llama-adapter", 4, 8, ["q_proj"], False)
        dirs["noweights"] = _adapter(root / "base", root / "noweights", 4, 8, ["q_proj"], False)
        (root / "noweights" / "adapter_model.safetensors").unlink()
    return root / "base", dirs


@pytest.fixture(scope="module")
def vexec(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmExecutor]:
    base_dir, dirs = checkpoints
    config = VllmConfig(
        settings=SETTINGS,
        device=VLLM_DEVICE,
        cache_dir=tmp_path_factory.mktemp("vllm-lora-models"),
        allow_download=False,
        max_loras=2,
        max_lora_rank=8,
    )
    executor = VllmExecutor(config)
    try:
        for name in ADAPTERS:  # declared before the base loads: registered when it does
            assert executor.adapters.add(name, BASE, dirs[name]) is None
        executor.load(ModelSpec(name=BASE, source=str(base_dir)))
        yield executor
    finally:
        executor.close()


@pytest.fixture
def model(vexec: VllmExecutor) -> VllmLoadedModel:
    loaded = vexec.models[BASE]
    assert isinstance(loaded, VllmLoadedModel)
    return loaded


def request(base: VllmLoadedModel, name: str, rid: str, prompt: str = PROMPT) -> GenerationRequest:
    return dataclasses.replace(build_request(base, prompt, request_id=rid, max_tokens=N), model=name)


def reference(base_dir: Path, dirs: dict[str, Path], name: str) -> torch.nn.Module:
    return fresh_base(base_dir) if name == BASE else merged(base_dir, dirs[name])


def test_adapters_register_with_their_base(vexec: VllmExecutor, model: VllmLoadedModel) -> None:
    assert isinstance(vexec, LoraBackend)
    assert vexec.adapters.serving(vexec.serving_model_names()) == tuple(sorted([BASE, *ADAPTERS]))
    assert vexec.model_names() == (BASE,)  # adapters are no models of their own
    assert {n: vexec.adapters.base_of(n) for n in ADAPTERS} == dict.fromkeys(ADAPTERS, BASE)
    assert set(vexec.adapters.with_adapters(vexec.models)) == {BASE, *ADAPTERS}
    # vLLM got LoRA on from the engine's settings: max_loras 2 (and on CPU a slot for the zero adapter
    # base requests carry: vllm_zero_adapter), rank 8 (a value vLLM takes)
    lora = model.model.vllm_config.lora_config
    assert (lora.max_loras, lora.max_lora_rank) == (2 + (VLLM_DEVICE == "cpu"), 8)


async def test_each_adapter_equals_hf_generate_on_the_merged_base(
    vexec: VllmExecutor, model: VllmLoadedModel, checkpoints
) -> None:
    base_dir, dirs = checkpoints
    for i, name in enumerate(ADAPTERS):
        req = request(model, name, f"single-{i}")
        chunks = await vexec.submit(req).collect()
        cc.check_stream(chunks)
        want = hf_greedy(reference(base_dir, dirs, name), req.prompt_token_ids, N)
        assert cc.ids(chunks) == want, name
        assert cc.text(chunks) == model.tokenizer.decode(want, skip_special_tokens=True)
    base_out = cc.ids(await vexec.submit(request(model, BASE, "single-base")).collect())
    assert base_out == hf_greedy(fresh_base(base_dir), request(model, BASE, "x").prompt_token_ids, N)
    assert all(
        base_out != hf_greedy(merged(base_dir, dirs[n]), request(model, n, "x").prompt_token_ids, N)
        for n in ADAPTERS
    )  # each adapter changes the output


async def test_a_batch_mixing_adapters_and_the_base_gives_each_row_its_own_output(
    vexec: VllmExecutor, model: VllmLoadedModel, checkpoints
) -> None:
    base_dir, dirs = checkpoints
    # three adapters with max_loras 2: vLLM batches two at a time and holds two; every row is right
    names = ["qv", BASE, "all", "mlp", BASE, "qv"]
    prompts = [PROMPT, "The quick brown fox", PROMPT, "Good morning! How are you today?", PROMPT, "Numbers"]
    reqs = [request(model, n, f"mix-{i}", p) for i, (n, p) in enumerate(zip(names, prompts, strict=True))]
    streams = [vexec.submit(r) for r in reqs]  # submitted together: vLLM batches them
    snap = vexec.load_snapshot()
    assert {m for m in snap.requests.models} <= {BASE}  # an adapter's request holds its base's KV
    outs = await asyncio.gather(*(s.collect() for s in streams))
    for name, req, chunks in zip(names, reqs, outs, strict=True):
        cc.check_stream(chunks)
        assert cc.ids(chunks) == hf_greedy(reference(base_dir, dirs, name), req.prompt_token_ids, N), name


async def test_the_load_report_lists_the_adapters_vllm_holds(
    vexec: VllmExecutor, model: VllmLoadedModel
) -> None:
    for i, name in enumerate(["mlp", "qv", "all"]):
        await vexec.submit(request(model, name, f"report-{i}")).collect()

    def held() -> tuple[str, ...]:
        (m,) = vexec.load_snapshot().models
        return m.adapters

    # vLLM's cache holds max_loras adapters (on CPU one more while no base request holds the zero
    # adapter's place): qv and all, the last two, least recently used first; never the zero adapter
    await cc.wait_for(lambda: held()[-2:] == ("qv", "all"), WAIT_S)
    (m,) = vexec.load_snapshot().models
    assert set(m.adapters) <= set(ADAPTERS) and len(m.adapters) <= 2 + (VLLM_DEVICE == "cpu")
    assert m.model == BASE and m.adapter_loads >= 3 and m.adapter_slots == 2
    # the loads on /metrics, as the native and emulated engines export them
    metrics = EngineMetrics(CollectorRegistry())
    metrics.attach(vexec.load_snapshot)
    text = generate_latest(metrics.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("llmfleet_lora_adapter_loads_total{"))
    assert f'model_name="{BASE}"' in line and float(line.split()[-1]) >= 3


async def test_bad_adapters_are_refused_by_name_and_the_engine_keeps_serving(
    vexec: VllmExecutor, model: VllmLoadedModel, checkpoints
) -> None:
    _, dirs = checkpoints
    refusals = {
        "rank16": r"adapter 'rank16': rank 16 of .*q_proj' exceeds the engine's max rank 8",
        "llama": r"adapter 'llama': .*q_proj' has A \(4, 64\) and B \(64, 4\); the base's Linear is 128 ->",
        "noweights": r"adapter 'noweights': .*adapter_model.safetensors is missing",
    }
    for name, match in refusals.items():
        with pytest.raises(AdapterError, match=match):
            vexec.adapters.add(name, BASE, dirs[name])
        assert vexec.adapters.base_of(name) is None
    assert vexec.adapters.add("later", "not-loaded", dirs["qv"]) is None  # declared: waits for its base
    assert vexec.adapters.remove("later")
    with pytest.raises(UnknownModelError):
        vexec.submit(request(model, "rank16", "refused"))
    chunks = await vexec.submit(request(model, "qv", "after-refusals")).collect()
    cc.check_stream(chunks)
    assert len(cc.ids(chunks)) > 0


async def test_an_adapter_added_while_its_base_runs_is_served_at_once(
    vexec: VllmExecutor, model: VllmLoadedModel, checkpoints
) -> None:
    base_dir, dirs = checkpoints
    added = vexec.adapters.add("qv-too", BASE, dirs["qv"])
    assert added is not None and added.base == BASE and added.rank == 4
    req = request(model, "qv-too", "added")
    chunks = await vexec.submit(req).collect()
    assert cc.ids(chunks) == hf_greedy(merged(base_dir, dirs["qv"]), req.prompt_token_ids, N)
    assert vexec.adapters.remove("qv-too") and vexec.adapters.base_of("qv-too") is None


async def test_generate_over_grpc_names_the_adapter_and_watchload_lists_it(
    vexec: VllmExecutor, model: VllmLoadedModel, checkpoints
) -> None:
    """The Engine service validates an adapter's request with its base and streams the adapter's
    tokens; WatchLoad carries the adapters vLLM holds; an unknown adapter is NOT_FOUND."""
    base_dir, dirs = checkpoints
    servicer = EngineServicer(vexec, "vllm-lora-engine")
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()
    channel = open_channel(server.address)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        sampling = common_pb2.SamplingParams(max_tokens=N)
        chunks = [
            c
            async for c in stub.Generate(
                engine_pb2.GenerateRequest(model="mlp", prompt=PROMPT, sampling=sampling)
            )
        ]
        want = hf_greedy(merged(base_dir, dirs["mlp"]), request(model, "mlp", "x").prompt_token_ids, N)
        assert [t for c in chunks for t in c.token_ids] == want

        async def watched() -> list[str]:
            snapshots = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
            snapshot = await snapshots.read()
            snapshots.cancel()
            (m,) = snapshot.models
            return list(m.adapters)

        for _ in range(100):
            if (await watched())[-1:] == ["mlp"]:
                break
            await asyncio.sleep(0.05)
        assert (await watched())[-1:] == ["mlp"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(engine_pb2.GenerateRequest(model="rank16", prompt=PROMPT)):
                pass
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await channel.close()
        await server.stop(0)
