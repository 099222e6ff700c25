"""What counting a vLLM engine's KV-cache events costs the engine node (``vllm_kv_events``).

vLLM's own ZeroMQ publisher (``ZmqEventPublisher``, as an engine core runs it) sends ``--batches``
batches of ``--blocks`` stored block hashes, every other batch also removing half of them, over
``ipc://`` sockets; once with :class:`~llmfleet_engine.vllm_kv_events.CachedBlocks` counting them and
once with no subscriber, ``--repeats`` times, interleaved. The difference in this process's CPU time
per batch is the counter's cost. vLLM sends at most one batch per engine step.

    python -m tools.bench.vllm_kv_events_cost [--batches 20000] [--blocks 16] [--repeats 3] [--out FILE]

Needs vLLM (``make setup-vllm``). Prints one line per repeat and writes the numbers as JSON to ``--out``
(default ``.bench/vllm-kv-events/cost.json``).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from llmfleet_engine.vllm_compat import import_vllm, kv_event_decoder
from llmfleet_engine.vllm_kv_events import CachedBlocks, endpoints

SETTLE_S = 0.3  # for the subscription to take hold before the first batch


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(batches: int, blocks: int, counted: bool) -> tuple[float, int | None]:
    """CPU seconds to publish (and, if ``counted``, count) the batches; the final count."""
    from vllm.distributed import kv_events as ev

    where = endpoints(tempfile.mkdtemp(prefix="kv-events-cost-"), "bench")
    pub = ev.ZmqEventPublisher(0, endpoint=where.publish, replay_endpoint=where.replay)
    counter = CachedBlocks(where, kv_event_decoder(import_vllm()), "bench") if counted else None
    time.sleep(SETTLE_S)
    start = cpu_s()
    for i in range(batches):
        hashes: list[bytes | int] = list(range(i * blocks, (i + 1) * blocks))
        events: list[Any] = [
            ev.BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[1] * (16 * blocks),
                           block_size=16, lora_id=None, medium="GPU", lora_name=None, group_idx=0)
        ]  # fmt: skip
        if i % 2:
            events.append(ev.BlockRemoved(block_hashes=hashes[: blocks // 2], medium="GPU", group_idx=0))
        pub.publish(ev.KVEventBatch(ts=time.time(), events=events))
    if counter is not None:
        while counter.batches < batches:
            time.sleep(0.01)
    pub.shutdown()
    spent = cpu_s() - start
    count = counter.count() if counter is not None else None
    if counter is not None:
        counter.close()
    return spent, count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20_000)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(".bench/vllm-kv-events/cost.json"))
    a = ap.parse_args(argv)
    expected = a.batches * a.blocks - (a.batches // 2) * (a.blocks // 2)
    rows = []
    for rep in range(a.repeats):
        alone, _ = run(a.batches, a.blocks, counted=False)
        with_counter, count = run(a.batches, a.blocks, counted=True)
        per_batch_us = (with_counter - alone) / a.batches * 1e6
        rows.append({"publish_only_cpu_s": alone, "with_counter_cpu_s": with_counter,
                     "counter_us_per_batch": per_batch_us, "count": count})  # fmt: skip
        print(
            f"repeat {rep}: publishing alone {alone:.2f} CPU-s, with the counter {with_counter:.2f} CPU-s: "
            f"{per_batch_us:.1f} µs per batch of {a.blocks} stored hashes (count {count}, expected {expected})"
        )
        if count != expected:
            raise SystemExit(f"the counter read {count} cached blocks, expected {expected}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"batches": a.batches, "blocks": a.blocks, "repeats": rows}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
