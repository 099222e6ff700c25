"""The vLLM backend's LoRA parts without starting vLLM: the engine arguments LoRA adds, the engine's
flags, the adapter registry (checks, routing to a ``LoRARequest``, following its base), the zero adapter
base requests carry on CPU and the residency read from ``list_loras``. The real engine is in
test_vllm_lora.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from llmfleet.types import ModelSpec
from llmfleet_engine import main
from llmfleet_engine import vllm_config as vconf
from llmfleet_engine.lora import DEFAULT_TARGETS, AdapterError, load_adapter
from llmfleet_engine.models import LoadedModel, load_model
from llmfleet_engine.vllm_adapters import VllmAdapters
from llmfleet_engine.vllm_lora_residency import LoraResidency
from llmfleet_engine.vllm_zero_adapter import ZERO_LORA_ID, ZERO_LORA_NAME, write_zero_adapter
from lora_checkpoints import save_checkpoints


@dataclass
class FakeLoRARequest:
    """Shaped like ``vllm.lora.request.LoRARequest`` (the fields the registry sets)."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    load_inplace: bool = False


@dataclass
class FakeBases:
    """The executor's side the registry follows: its loaded models and their change hook."""

    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    on_models_changed: list[Callable[[tuple[str, ...]], None]] = field(default_factory=list)

    @property
    def models(self) -> dict[str, LoadedModel]:
        return dict(self.loaded)

    def serving_model_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.loaded))

    def set(self, **models: LoadedModel) -> None:
        self.loaded = dict(models)
        for hook in self.on_models_changed:
            hook(tuple(sorted(self.loaded)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, Path]]:
    return save_checkpoints(tmp_path_factory.mktemp("vllm-lora-map"), cache_dir)


@pytest.fixture(scope="module")
def base(checkpoints, cache_dir: Path) -> LoadedModel:
    return load_model(ModelSpec(name="b", source=str(checkpoints[0])), cache_dir=cache_dir)


def test_engine_kwargs_turn_lora_on_with_the_engines_settings() -> None:
    off = vconf.engine_kwargs(vconf.VllmConfig(device="cpu"), "m", "auto")
    assert not {"enable_lora", "max_loras", "max_lora_rank"} & off.keys()
    gpu = vconf.engine_kwargs(vconf.VllmConfig(max_loras=4, max_lora_rank=12), "m", "auto")
    assert (gpu["enable_lora"], gpu["max_loras"], gpu["max_lora_rank"]) == (True, 4, 16)
    cpu = vconf.engine_kwargs(vconf.VllmConfig(device="cpu", max_loras=4, max_lora_rank=8), "m", "auto")
    assert (cpu["max_loras"], cpu["max_lora_rank"]) == (5, 8)  # one more slot: the zero adapter
    assert [vconf.vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match=r"max_lora_rank must be 1\.\.512"):
        vconf.VllmConfig(max_lora_rank=513)


def test_the_engine_takes_lora_flags_and_adapters_on_the_vllm_backend() -> None:
    args = main.build_parser().parse_args(
        ["--backend", "vllm", "--max-loras", "2", "--max-lora-rank", "8", "--adapter", "a=b:/d"]
    )
    assert main.lora_settings(args.engine_config) == {"max_loras": 2, "max_lora_rank": 8}
    assert args.adapter == [("a", "b", "/d")]


def test_adapters_register_with_their_base_and_route_to_lora_requests(base: LoadedModel, checkpoints) -> None:
    _, dirs = checkpoints
    bases = FakeBases()
    reg = VllmAdapters(bases, max_loras=2, max_rank=8, lora_request_cls=FakeLoRARequest)
    assert reg.add("qv", "b", dirs["qv"]) is None  # declared: its base is not loaded
    assert reg.route("qv") == ("qv", None) and reg.base_of("qv") is None
    bases.set(b=base)  # the base loads: the declared adapter registers
    assert reg.base_of("qv") == "b" and reg.serving(("b",)) == ("b", "qv")
    added = reg.add("all", "b", dirs["all"])
    assert added is not None and (added.rank, added.lora_id) == (8, 2)
    model, lora = reg.route("all")
    assert model == "b" and lora == FakeLoRARequest("all", 2, str(dirs["all"].resolve()))
    assert reg.route("b") == ("b", None)  # no zero adapter off CPU
    again = reg.add("all", "b", dirs["all"])  # registered again: its next request reloads it, same id
    assert again is not None and again.lora_id == 2
    assert reg.route("all")[1].load_inplace and not reg.route("all")[1].load_inplace
    assert set(reg.with_adapters(bases.models)) == {"b", "qv", "all"}
    bases.set()  # the base leaves: its adapters' registrations go, the declarations stay
    assert reg.base_of("qv") is None and reg.serving(()) == ()
    bases.set(b=base)
    assert reg.base_of("qv") == reg.base_of("all") == "b"
    assert reg.name_of(1) == "qv" and reg.name_of(99) is None


def test_adapters_are_refused_with_the_native_engines_words(base: LoadedModel, checkpoints) -> None:
    _, dirs = checkpoints
    bases = FakeBases(loaded={"b": base})
    reg = VllmAdapters(bases, max_loras=2, max_rank=4, lora_request_cls=FakeLoRARequest)
    with pytest.raises(AdapterError, match=r"adapter 'all': rank 8 of .* exceeds the engine's max rank 4"):
        reg.add("all", "b", dirs["all"])
    with pytest.raises(AdapterError, match=r"adapter 'x': .*adapter_config.json is missing"):
        reg.add("x", "b", dirs["qv"].parent)
    with pytest.raises(AdapterError, match="adapter 'b': a model of that name is loaded here"):
        reg.add("b", "b", dirs["qv"])
    off = VllmAdapters(
        FakeBases(loaded={"b": base}), max_loras=0, max_rank=8, lora_request_cls=FakeLoRARequest
    )
    with pytest.raises(AdapterError, match=r"LoRA is off on this engine \(max_loras 0\)"):
        off.add("qv", "b", dirs["qv"])
    assert reg.base_of("all") is None and reg.route("all") == ("all", None)


def test_on_cpu_a_base_request_carries_the_zero_adapter(base: LoadedModel, tmp_path: Path) -> None:
    bases = FakeBases()
    reg = VllmAdapters(
        bases, max_loras=2, max_rank=8, lora_request_cls=FakeLoRARequest, zero_dir=tmp_path / "zero"
    )
    bases.set(b=base)
    model, lora = reg.route("b")
    assert model == "b" and (lora.lora_name, lora.lora_int_id) == (ZERO_LORA_NAME, ZERO_LORA_ID)
    checked = load_adapter("zero", lora.lora_path, base.model, max_rank=1, targets=DEFAULT_TARGETS)
    assert checked.rank == 1 and all(not a.any() and not b.any() for a, b in checked.weights.values())
    reg.close()
    assert not (tmp_path / "zero").exists()


def test_the_zero_adapter_targets_a_linear_the_base_has(base: LoadedModel, tmp_path: Path) -> None:
    with torch.device("meta"):
        skeleton = type(base.model)(base.model.config)
    path = write_zero_adapter(skeleton, tmp_path / "z")
    checked = load_adapter("z", path, base.model, max_rank=1, targets=DEFAULT_TARGETS)
    assert list(checked.weights) == ["model.layers.0.self_attn.q_proj"]


async def test_residency_reads_list_loras_least_recently_used_first() -> None:
    answers = [{1, 2, ZERO_LORA_ID}, {2, 3}]
    asked = 0

    async def list_loras() -> set[int]:
        nonlocal asked
        asked += 1
        return answers[min(asked, len(answers)) - 1]

    res = LoraResidency(list_loras, hidden=frozenset({ZERO_LORA_ID}), min_interval_s=0.0)
    for lora_id in (2, 1):
        res.used(lora_id)
    res.refresh()
    res.refresh()  # asked meanwhile: one more question after the one in flight
    for _ in range(20):
        await asyncio.sleep(0)
    assert asked == 2
    assert res.resident() == [3, 2] and res.loads == 3  # 3 never requested here: first
    res.used(3)
    assert res.resident() == [2, 3]
