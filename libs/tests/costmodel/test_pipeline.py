"""Power caps as a speed factor and a layer pipeline over mixed GPUs as one device (UELLM's testbed)."""

from __future__ import annotations

import pytest
from llmfleet.costmodel import decode_time, model_arch
from llmfleet.costmodel.iteration_costs import roofline_cost
from llmfleet.costmodel.pipeline import (
    NO_OVERHEAD,
    RTX_3090,
    PipelineOverhead,
    balanced_layers,
    pipeline,
    power_capped,
    static_batch_time,
)


def test_power_cap_scales_compute_and_bandwidth() -> None:
    h = power_capped(RTX_3090, 175, 350)
    assert h.peak_flops == pytest.approx(RTX_3090.peak_flops / 2)
    assert h.mem_bandwidth == pytest.approx(RTX_3090.mem_bandwidth / 2)
    assert h.mem_bytes == RTX_3090.mem_bytes and h.name == "rtx-3090@175W"
    assert power_capped(RTX_3090, 400, 350).peak_flops == RTX_3090.peak_flops  # a cap above TDP is no boost
    with pytest.raises(ValueError, match="must be > 0 W"):
        power_capped(RTX_3090, 0, 350)


def test_pipeline_time_is_the_layer_weighted_sum_of_its_stages() -> None:
    arch = model_arch("llama2-7b")
    fast, slow = RTX_3090, power_capped(RTX_3090, 150, 350)
    one = pipeline([(fast, 32)])
    assert one.bandwidth == pytest.approx(fast.bandwidth) and one.flops == pytest.approx(fast.flops)
    mixed = pipeline([(fast, 24), (slow, 8)])
    # batch-1 decode is memory-bound on every stage, so the roofline is exactly additive over layers
    want = 0.75 * decode_time(arch, fast, 1, 300) + 0.25 * decode_time(arch, slow, 1, 300)
    assert decode_time(arch, mixed, 1, 300) == pytest.approx(want, rel=1e-9)
    assert mixed.mem_bytes == 2 * RTX_3090.mem_bytes
    assert pipeline([(fast, 32), (slow, 0)]).mem_bytes == RTX_3090.mem_bytes  # an empty stage is not used
    with pytest.raises(ValueError, match="not all 0"):
        pipeline([(fast, 0)])
    with pytest.raises(ValueError, match="at least one stage"):
        pipeline([])


def test_balanced_layers_is_accelerate_auto() -> None:
    assert balanced_layers(32, 4) == [8, 8, 8, 8]
    assert balanced_layers(32, 3) == [11, 11, 10]
    with pytest.raises(ValueError, match="cannot split 2 layers over 3 devices"):
        balanced_layers(2, 3)


def test_static_batch_time_charges_the_overhead_once_per_iteration_and_stage_boundary() -> None:
    cost = roofline_cost(model_arch("chatglm2-6b"), RTX_3090)
    prompts = [20, 35, 10]
    bare = static_batch_time(cost, prompts, 100, NO_OVERHEAD, 4)
    # padded: three rows of the longest prompt, then 99 decode steps of all three rows
    expected = cost.prefill(3 * 35, 3 * 35 * 35) + sum(cost.decode(3, 3 * (35 + i)) for i in range(1, 100))
    assert bare == pytest.approx(expected, rel=1e-9)
    over = PipelineOverhead(per_iteration_s=0.01, per_stage_s=0.002)
    assert over.iteration(4) == pytest.approx(0.016)
    assert static_batch_time(cost, prompts, 100, over, 4) == pytest.approx(bare + 100 * 0.016)
    assert static_batch_time(cost, prompts, 100, over, 1) == pytest.approx(bare + 100 * 0.01)
    with pytest.raises(ValueError, match="at least one step"):
        static_batch_time(cost, prompts, 0, over, 1)
    with pytest.raises(ValueError, match="≥ 0"):
        PipelineOverhead(-1.0, 0.0)
