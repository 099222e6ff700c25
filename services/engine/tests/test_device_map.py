"""Loading a model with a HELR ``device_map`` (UELLM §4.3): checked, carried in ModelSpec, same tokens."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import chunk_checks as cc
import pytest
import torch
from llmfleet.policies.placement.device_topology import Device, LayeredModel, Topology
from llmfleet.policies.placement.helr import HelrOptions, HelrPlanner
from llmfleet.types import DesiredPlacement, ModelSpec
from llmfleet_engine.models import (
    LoadedModel,
    ModelLoadError,
    check_device_map,
    load_model,
    tiny_config,
)
from llmfleet_engine.validation import build_request
from transformers import AutoModelForCausalLM


def helr_cpu_map(model: LoadedModel, mode: str = "helr") -> tuple[tuple[str, str], ...]:
    """A HELR plan for ``model`` on a one-device (cpu) topology, as ModelSpec carries it."""
    layered = LayeredModel.from_hf_config(model.model.config, dtype=model.dtype, name=model.name)
    topo = Topology((Device("cpu", 4 * layered.total_bytes, 1.0),), {})
    plan = HelrPlanner(HelrOptions(mode=mode)).device_map(topo, layered)
    assert plan.order == ("cpu",) and plan.layers == (model.model.config.num_hidden_layers,)
    return plan.device_map_pairs()


@pytest.mark.parametrize("fixture", ["llama", "qwen2"])
def test_mapped_load_generates_the_same_tokens(
    fixture: str, request: pytest.FixtureRequest, cache_dir: Path, prompts, hf_greedy
) -> None:
    plain: LoadedModel = request.getfixturevalue(fixture)
    spec = ModelSpec(f"{fixture}-mapped", f"tiny://{fixture}", device_map=helr_cpu_map(plain))
    mapped = load_model(spec, cache_dir=cache_dir, allow_download=False)
    assert mapped.device == "cpu" and mapped.spec == spec and mapped.device_map == spec.device_map
    assert {str(p.device) for p in mapped.model.parameters()} == {"cpu"}  # real weights, not meta
    for prompt in prompts[:4]:
        ids = plain.tokenizer(prompt)["input_ids"]
        assert hf_greedy(mapped, ids, 16) == hf_greedy(plain, ids, 16)


async def test_executor_loads_a_mapped_spec(make_executor, llama: LoadedModel, prompts, hf_greedy) -> None:
    spec = ModelSpec("tiny-llama-mapped", "tiny://llama", device_map=helr_cpu_map(llama, "lr"))
    executor = make_executor()
    loaded = executor.host.load(spec).model
    assert loaded.device == "cpu" and loaded.device_map == spec.device_map
    for prompt in prompts[:2]:
        req = build_request(loaded, prompt, max_tokens=12)
        chunks = await executor.submit(req).collect()
        assert cc.ids(chunks) == hf_greedy(llama, req.prompt_token_ids, 12)


def _spec(pairs) -> ModelSpec:
    return ModelSpec("bad", "tiny://llama", device_map=tuple(pairs))


def test_bad_maps_are_rejected_naming_the_modules(cache_dir: Path, llama: LoadedModel) -> None:
    good = list(helr_cpu_map(llama))
    cases = {
        "without a device: \\['lm_head'\\]": [p for p in good if p[0] != "lm_head"],
        "unknown modules \\['model.bogus'\\]": [*good, ("model.bogus", "cpu")],
        "more than once \\(nested keys\\): \\['model', ": [*good, ("model", "cpu")],
        "more than once: \\['lm_head'\\]": [*good, ("lm_head", "cpu")],
        "only real cpu/cuda": [(m, "meta") for m, _ in good],
        "bad device 'gpu0'": [(m, "gpu0") for m, _ in good],
    }
    if not torch.cuda.is_available():
        cases["host has 0 CUDA devices"] = [(m, "cuda:0") for m, _ in good]
    for message, pairs in cases.items():
        with pytest.raises(ModelLoadError, match=message):
            load_model(_spec(pairs), cache_dir=cache_dir, allow_download=False)


def test_tied_parameters_must_share_a_device() -> None:
    """Qwen2's lm_head is the embedding tensor: a map splitting them is refused; HELR keeps them together."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    layered = LayeredModel.from_hf_config(skeleton.config, dtype="float32", name="qwen2")
    assert layered.tied_embeddings
    topo = Topology(
        (Device("cuda:0", int(2.5 * layered.bytes_per_layer), 4.0), Device("cpu", 2**34, 1.0)),
        {("cuda:0", "cpu"): 0.0},
    )
    plan = HelrPlanner(HelrOptions(mode="lr")).device_map(topo, layered)
    assert plan.order == ("cuda:0", "cpu") and plan.layers == (2, 1)
    assert plan.device_map["lm_head"] == plan.device_map["model.embed_tokens"] == "cuda:0"
    split = {**plan.device_map, "lm_head": "cpu"}
    with pytest.raises(ModelLoadError, match=r"tied parameters across devices.*lm_head\.weight"):
        check_device_map(skeleton, tuple(split.items()))
    if torch.cuda.is_available():
        assert check_device_map(skeleton, plan.device_map_pairs()) == plan.device_map


def test_whole_model_key_is_one_cover(cache_dir: Path, llama: LoadedModel) -> None:
    m = load_model(_spec([("", "cpu")]), cache_dir=cache_dir, allow_download=False)
    assert m.device == "cpu"


def test_model_spec_device_map_json_round_trip() -> None:
    pairs = (("model.embed_tokens", "cuda:0"), ("model.layers.0", "cuda:1"), ("lm_head", "cuda:1"))
    mapped = ModelSpec("a", "tiny://llama", device_map=pairs)
    assert ModelSpec("a", "tiny://llama", device_map=dict(pairs)) == mapped  # a dict is accepted
    dp = DesiredPlacement("e0", (mapped, ModelSpec("b", "tiny://qwen2")))
    raw = json.loads(dp.to_json())
    assert raw["models"][0]["device_map"] == [list(p) for p in pairs]
    assert "device_map" not in raw["models"][1]  # records without a map are unchanged
    back = DesiredPlacement.from_json(dp.to_json())
    assert back == dp and hash(back.models[0]) == hash(mapped)
    old = json.dumps({"engine_id": "e0", "models": [{"name": "a", "source": "s", "dtype": "float16"}]})
    assert DesiredPlacement.from_json(old).models == (ModelSpec("a", "s", "float16"),)
    assert dataclasses.replace(mapped, device_map=()).device_map == ()


async def test_a_new_device_map_is_a_new_load_not_already_loaded(make_executor, llama: LoadedModel) -> None:
    """Same name, source and dtype but another map: load() refuses it as a conflict and reconcile
    reloads the model with the new map (it used to keep the old one as "already loaded")."""
    from llmfleet_engine.outputs import ModelConflictError

    plain = ModelSpec("m", "tiny://llama")
    mapped = dataclasses.replace(plain, device_map=helr_cpu_map(llama))
    executor = make_executor()
    executor.host.load(plain)
    assert executor.host.load(plain).already_loaded
    with pytest.raises(ModelConflictError):
        executor.host.load(mapped)
    result = executor.host.reconcile([mapped])
    assert "m" in result.unloaded and result.loaded == ["m"] and not result.errors
    assert executor.host.models["m"].device_map == mapped.device_map
