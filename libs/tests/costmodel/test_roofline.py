"""Roofline sanity: memory-bound decode, compute-bound prefill, tensor parallelism, monotonicity."""

import pytest
from llmfleet.costmodel import RooflineModel, allreduce_time, decode_time, hardware, model_arch, prefill_time

A7 = model_arch("llama2-7b")
A100 = hardware("a100-80gb")


def test_small_batch_decode_is_weight_bound():
    t = decode_time(A7, A100, 1, 128)
    assert A7.weight_bytes == pytest.approx(13.5e9, rel=0.01)
    assert 0.5 * 6.7e-3 < t < 2 * 6.7e-3
    assert t == pytest.approx((A7.weight_bytes + 128 * A7.kv_bytes_per_token) / A100.bandwidth)


def test_long_prefill_is_compute_bound():
    t = prefill_time(A7, A100, 4096)
    memory = (A7.weight_bytes + 4096 * A7.kv_bytes_per_token) / A100.bandwidth
    assert t > 5 * memory
    assert t == pytest.approx(
        (2 * A7.matmul_params * 4096 + 2 * A7.num_layers * 4096 * 4096**2) / A100.flops, rel=1e-9
    )
    # batching short prompts costs less attention than one long prompt of the same total
    assert prefill_time(A7, A100, 4096, seq_lens=[512] * 8) < t


def test_tp2_halves_compute_and_adds_allreduce():
    t1, t2 = prefill_time(A7, A100, 4096), prefill_time(A7, A100, 4096, tp=2)
    comm = allreduce_time(A7, A100, 4096, tp=2)
    assert comm > 0 and allreduce_time(A7, A100, 4096, tp=1) == 0
    assert t2 - comm == pytest.approx(t1 / 2)
    assert decode_time(A7, A100, 1, 128, tp=2) > decode_time(A7, A100, 1, 128) / 2


def test_monotone():
    pre = [prefill_time(A7, A100, t) for t in (1, 16, 256, 1024, 8192)]
    dec_b = [decode_time(A7, A100, b, 1024) for b in (1, 8, 64, 256)]
    dec_l = [decode_time(A7, A100, 8, ln) for ln in (1, 512, 4096)]
    for seq in (pre, dec_b, dec_l):
        assert seq == sorted(seq) and len(set(seq)) == len(seq)


def test_roofline_model_interface_and_context_limit():
    m = RooflineModel(A7, A100, tp=2)
    assert m.source == "roofline"
    assert m.prefill.predict(1000) == m.prefill_time(1000) == prefill_time(A7, A100, 1000, 2)
    assert m.decode.predict(4, 100) == m.decode_time(4, 100) == decode_time(A7, A100, 4, 100, 2)
    limit = m.decode.context_limit(8, 0.02)
    assert limit > 0 and m.decode.predict(8, limit / 8) == pytest.approx(0.02)
    assert m.decode.context_limit(8, 1e-4) == 0.0
    with pytest.raises(ValueError):
        prefill_time(A7, A100, 10, tp=0)


def test_roofline_solo_closed_form_matches_the_sum_across_the_compute_memory_crossing():
    import dataclasses

    from llmfleet.costmodel import decode_time, hardware, model_arch, prefill_time
    from llmfleet.costmodel.roofline import solo_time

    arch = model_arch("llama2-70b")  # GQA: the compute leg overtakes the memory leg at some context
    base = hardware("a100-80gb")
    hw = dataclasses.replace(base, peak_flops=1.05 * base.bandwidth / base.compute_eff)  # F ≈ B
    for prompt, out in ((10, 1), (10, 2), (100, 300), (2000, 1500), (0, 4000)):
        brute = prefill_time(arch, hw, prompt, 1, [prompt]) + sum(
            decode_time(arch, hw, 1, x) for x in range(prompt + 1, prompt + out)
        )
        assert solo_time(arch, hw, prompt, out) == pytest.approx(brute, rel=1e-9)
    # and the two legs really cross inside the last case's range: memory on top at 1, compute at 4000
    attn = arch.num_layers * arch.num_heads * arch.head_dim
    compute = [(2 * arch.matmul_params + 4 * attn * x) / hw.flops for x in (1, 4000)]
    memory = [(arch.weight_bytes + arch.kv_bytes_per_token * x) / hw.bandwidth for x in (1, 4000)]
    assert memory[0] > compute[0] and compute[1] > memory[1]
    # at TP 2 every decode step also pays its all-reduce
    tp2 = prefill_time(arch, base, 500, 2, [500]) + sum(
        decode_time(arch, base, 1, x, 2) for x in range(501, 800)
    )
    assert solo_time(arch, base, 500, 300, tp=2) == pytest.approx(tp2, rel=1e-9)
