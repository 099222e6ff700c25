"""``make bench-fairness BENCH_ARGS=--live``: the fairness bench's arms on a live cluster.

``llmfleet up --emulate NxA100-80GB`` (``--live-gpus`` emulated GPUs, default 1, each engine running at
most ``--live-slots`` requests at once, late binding with no queue slack: every request beyond them
waits in the scheduler's hold queue; every key's rate is per GPU, so each engine sees the same load), API keys ``light``, ``heavy``, ``high`` (max_priority 1) and ``low``, one
service of 32-token streams. Each key is an SDK client sending an open-loop Poisson stream for
``--live-step-s``; TTFT is the client's, to its first token. One cluster per ``fairness`` setting
(``vtc``, then ``none``, the cluster file's ``scheduler:`` section). With ``--live-repeats N`` the
cluster runs its arms N times over, in turn (arm 1, 2, …, 1, 2, …), and each arm's TTFTs are pooled,
so a p99 rests on N times the requests while a slow spell of the shared machine falls on every arm."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import Any

from llmfleet.client import AsyncClient

from tools.bench.local_up import LocalUp

SERVICE = "fair"
PROMPT = "Summarize the following text about fleets of language models serving many users at once"
KEYS = {
    "light": "sk-light-00001",
    "heavy": "sk-heavy-00001",
    "high": "sk-high-000001",
    "low": "sk-low-0000001",
}


def config(fairness: str, slots: int, tokens: int) -> dict[str, Any]:
    return {
        "services": {
            SERVICE: {"model": "emu-7b", "slo": {"ttft_s": 5.0, "tpot_s": 0.2}, "max_tokens": tokens}
        },
        "models": {
            "emu-7b": {"source": "emulated://llama2-7b", "dtype": "float16", "sim_model": "llama2-7b"}
        },
        "placement": {"policy": "colocate_all", "interval_s": 5},
        "scheduler": {"fairness": fairness, "binding": "late", "queue_slack": 0},
        "emulated": {"engine": {"max_running": slots}},
    }


async def stream(
    address: str, key: str, rate: float, duration_s: float, tokens: int, priority: int | None, seed: int
) -> dict[str, Any]:
    """One key's open-loop Poisson stream; its TTFTs and errors."""
    rng = random.Random(seed)
    ttfts: list[float] = []
    errors: list[str] = []
    async with AsyncClient(address, timeout_s=120, api_key=KEYS[key], retries=0) as client:
        await client.complete(PROMPT, SERVICE, max_tokens=1)  # open the channel

        async def one() -> None:
            t0 = time.perf_counter()
            try:
                first = None
                async with client.generate(PROMPT, SERVICE, max_tokens=tokens, priority=priority) as s:
                    async for chunk in s:
                        if first is None and chunk.token_ids:
                            first = time.perf_counter() - t0
                if first is not None:
                    ttfts.append(first)
            except Exception as e:  # counted, never fatal
                errors.append(f"{type(e).__name__}: {e}"[:160])

        tasks: set[asyncio.Task] = set()
        start = t = time.perf_counter()
        while (t := t + rng.expovariate(rate)) - start < duration_s:
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=120)
    return {"ttfts": ttfts, "errors": errors}


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def arm(
    address: str, streams: list[tuple[str, float, int | None]], step_s: float, tokens: int, repeat: int
) -> dict[str, dict[str, Any]]:
    """Each key's raw TTFTs and errors in one run of an arm (``repeat`` varies the streams' seeds)."""
    results = await asyncio.gather(
        *(
            stream(address, k, r, step_s, tokens, p, 100 * repeat + seed)
            for seed, (k, r, p) in enumerate(streams)
        )
    )
    return {k: res for (k, _, _), res in zip(streams, results, strict=True)}


def summary(res: dict[str, list]) -> dict[str, Any]:
    """A key's pooled TTFTs and errors as the report's columns (the JSON adds p90 and the slowest
    five)."""
    ttfts, errors = res["ttfts"], res["errors"]
    return {"served": len(ttfts), "p50_ttft_s": _p(ttfts, 0.5), "p90_ttft_s": _p(ttfts, 0.9),
            "p99_ttft_s": _p(ttfts, 0.99), "slowest_s": sorted(ttfts)[-5:],
            "errors": len(errors), "error_sample": errors[:2]}  # fmt: skip


def run_live(
    out: Path, slots: int, step_s: float, light_rate: float, tokens: int, repeats: int = 1, gpus: int = 1
) -> list[dict[str, Any]]:
    """Rows as the model's arms: (arm, key, fairness, served, p50, p99, errors)."""
    logging.getLogger("llmfleet.client").setLevel(logging.ERROR)
    keys = out / "keys.yaml"
    out.mkdir(parents=True, exist_ok=True)
    keys.write_text(
        "keys:\n"
        + "".join(
            f"  - {{name: {k}, key: {v}{', max_priority: 1' if k == 'high' else ''}}}\n"
            for k, v in KEYS.items()
        )
    )
    light_rate *= gpus
    heavy = 10 * light_rate
    plan = {
        "vtc": [
            ("light alone", [("light", light_rate, None)], "light"),
            ("light + 10x heavy", [("light", light_rate, None), ("heavy", heavy, None)], "light"),
            ("high alone", [("high", light_rate, 1)], "high"),
            ("high + low flood", [("high", light_rate, 1), ("low", heavy, 0)], "high"),
        ],
        "none": [("light + 10x heavy", [("light", light_rate, None), ("heavy", heavy, None)], "light")],
    }
    rows = []
    for fairness, arms in plan.items():
        up = LocalUp(out / fairness, config(fairness, slots, tokens), "--emulate", f"{gpus}xA100-80GB",
                     "--schedulers", "1", "--api-keys", str(keys))  # fmt: skip
        up.start()
        pooled: list[dict[str, dict[str, list]]] = [{} for _ in arms]
        try:
            for repeat in range(repeats):
                for i, (_, streams, _) in enumerate(arms):
                    got = asyncio.run(arm(up.scheduler, streams, step_s, tokens, repeat))
                    for k, res in got.items():
                        acc = pooled[i].setdefault(k, {"ttfts": [], "errors": []})
                        acc["ttfts"] += res["ttfts"]
                        acc["errors"] += res["errors"]
                    time.sleep(2)  # the queue drains between arms
        finally:
            up.stop()
        for (name, _, key), got in zip(arms, pooled, strict=True):
            rows.append({"arm": f"live: {name}, {fairness}", "key": key, "fairness": fairness, **summary(got[key]),
                         "others": {k: summary(v) for k, v in got.items() if k != key}})  # fmt: skip
    return rows
