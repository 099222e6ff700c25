"""FIFO-CM: FIFO order with SLO-ODBS's own memory-sized (CM) batches — UELLM's like-for-like FIFO."""

from llmfleet.policies.batching import SloOdbs, make_batching_policy
from llmfleet.policies.batching.fifo_cm import FifoCm
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

TPB = 16
LIMITS = BatchLimits(max_requests=256, max_prefill_tokens=1_000_000)


def q(rid: str, prompt: int, out: int, arrival: float, slo: float) -> SchedRequest:
    return SchedRequest(rid, "svc", "m", arrival, prompt, 2048, predicted_output_tokens=float(out),
                        deadline_s=arrival + slo)  # fmt: skip


def test_fifo_cm_keeps_arrival_order_and_ignores_slo_and_length() -> None:
    # later arrivals have tighter deadlines and very different outputs: SLO-ODBS reorders, FIFO-CM does not
    reqs = [q(f"r{i}", 20, 10 if i % 2 else 400, arrival=float(i), slo=300.0 - 30 * i) for i in range(8)]
    pool = PoolView(1_000_000, 0, {"m": TPB})
    b = FifoCm().partition(reqs, pool, LIMITS, now=10.0)
    assert [rid for batch in b for rid in batch.request_ids] == [r.request_id for r in reqs]
    assert make_batching_policy("fifo_cm").name == "fifo_cm"


def test_fifo_cm_batches_are_cm_sized() -> None:
    reqs = [q(f"r{i}", 50, 200, arrival=0.01 * i, slo=1e6) for i in range(40)]
    ref = SloOdbs()
    for free_blocks in (200, 2_000):
        pool = PoolView(free_blocks, 0, {"m": TPB})
        sizes = [len(b.request_ids) for b in FifoCm().partition(reqs, pool, LIMITS, now=1.0)]
        cm = ref.cm_batch_size("m", 50, 200.0, 1e6, pool, LIMITS)
        assert sizes[0] == min(cm, len(reqs))  # the first batch closes at exactly CM's size
    small = [
        len(b.request_ids) for b in FifoCm().partition(reqs, PoolView(200, 0, {"m": TPB}), LIMITS, now=1.0)
    ]
    big = [
        len(b.request_ids) for b in FifoCm().partition(reqs, PoolView(2_000, 0, {"m": TPB}), LIMITS, now=1.0)
    ]
    assert small[0] < big[0]  # less free KV → smaller batches
