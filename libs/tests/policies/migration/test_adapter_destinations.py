"""A request of a LoRA adapter moves only to a GPU serving that adapter (``RequestState.served_as`` in
``GpuState.models``, as an engine's node record lists its registered adapters beside its bases); its
migration names the base, whose KV it carries."""

from __future__ import annotations

from llmfleet.policies.migration.base import GpuState, RequestState
from llmfleet.policies.migration.llumnix_lb import LlumnixBalance
from llmfleet.policies.migration.mell import MellOptions, MellPacker
from mell_helpers import C, moves


def test_llumnix_skips_the_least_loaded_gpu_when_it_lacks_the_adapter() -> None:
    def plan(adapter: str) -> list[tuple[str, str, str]]:
        r, y = RequestState("r", "llama", 20, 20, adapter), RequestState("y", "llama", 40, 40)
        g0 = GpuState("g0", ("llama", "lora-a"), 100, (r, y))
        g1 = GpuState("g1", ("llama",), 100)  # the base without the adapter: least loaded
        g2 = GpuState("g2", ("llama", "lora-a"), 100, (RequestState("x", "llama", 5, 5),))
        out = LlumnixBalance().epoch([g0, g1, g2], 0.0)
        assert all(m.model == "llama" for m in out.migrations)  # the KV's model: the base
        return moves(out)

    assert plan("") == [("r", "g0", "g1")]  # a base request goes to the least loaded
    assert plan("lora-a") == [("r", "g0", "g2")]  # the adapter's only where it is served


def test_mell_allocates_an_adapters_request_only_beside_the_adapter() -> None:
    """Allocate moves a T arrival onto an L-GPU with room (``test_packer_moves_a_t_arrival_...``), but
    not an adapter's request onto a GPU that hosts its base without the adapter."""

    def epoch(l_gpu_models: tuple[str, ...]) -> list[tuple[str, str, str]]:
        def l_gpu() -> GpuState:
            return GpuState("g0", l_gpu_models, C, (RequestState("l", "m", 700),))

        p = MellPacker(MellOptions())
        assert p.epoch([l_gpu(), GpuState("g1", ("m", "lora"), C, active=False)], 0.0).migrations == ()
        t = RequestState("t", "m", 250, adapter="lora")
        return moves(p.epoch([l_gpu(), GpuState("g1", ("m", "lora"), C, (t,), active=False)], 1.0))

    assert epoch(("m", "lora")) == [("t", "g1", "g0")]
    assert epoch(("m",)) == []  # g0 cannot serve the adapter: the request stays where it is served
