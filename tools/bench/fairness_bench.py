"""``make bench-fairness``: what the hold queue's order does to one tenant's waits when another floods
a saturated service, and to high-priority waits under a low-priority flood.

A discrete-event model of one saturated model: ``--slots`` engine batch slots (a request holds one
from its dispatch to its last token: prefill at ``--prefill-s-per-token`` a prompt token, then
``--tpot-s`` an output token); requests that find no slot wait in the shipped hold queue
(``llmfleet.policies.capacity.make_hold_queue``: ``vtc`` or ``none``) behind an admission bound of
``--max-held`` (past it a request is refused, or the held one that would leave after it is displaced, as
``llmfleet_scheduler.admission`` does). Each dispatch charges its key ``weighted_tokens(prompt,
output)``. Open-loop Poisson arrivals for ``--duration-s``; TTFT = wait + prefill.

Arms (each the same seeds):

* ``light alone`` / ``light + 10x heavy`` under ``none`` and ``vtc``: the goal is the light key's p99
  TTFT under the flood within 1.5x of alone with ``vtc``.
* ``high alone`` / ``high + low flood``: a priority-1 stream alone and with a priority-0 flood (``vtc``):
  the goal is the high-priority p99 TTFT unchanged.
* ``..., vtc + preemption``: the same two floods where a held request that the engine core's
  preemption rule would let preempt (``llmfleet.policies.request.preemption.PreemptionRule``, asked
  through late binding's ``preempt_room.may_preempt``, with the engine's tenants' fairness credit,
  ``llmfleet.policies.request.slot_credit``, kept as the live gate keeps it) takes a running request's
  slot at once: the victim's output so far is folded into its prompt and it goes back to the hold queue
  (uncharged), re-prefilling prompt + output when it leaves again; a request is preempted at most
  twice. ``... without credit`` is the light key's arm with instantaneous fair shares only.

``--live`` runs the same arms on ``llmfleet up --emulate`` too (``tools/bench/fairness_live.py``).

Writes ``report.json`` and ``report.md`` to ``--out`` (default ``.bench/fairness``)."""

from __future__ import annotations

import argparse
import heapq
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.policies.capacity import HeldQueue, make_hold_queue, weighted_tokens
from llmfleet.policies.capacity.preempt_room import first_preempting, may_preempt
from llmfleet.policies.request.preemption import Claim, PreemptionRule
from llmfleet.policies.request.slot_credit import EngineCredits
from llmfleet.spec.defaults import Fairness


@dataclass(frozen=True)
class Stream:
    key: str
    rate: float  # requests/s
    priority: int = 0


@dataclass
class Setup:
    slots: int = 8
    prompt_tokens: int = 200
    output_tokens: int = 100
    prefill_s_per_token: float = 0.0002
    tpot_s: float = 0.02
    max_held: int = 64
    duration_s: float = 600.0
    seed: int = 1


@dataclass
class Outcome:
    served: dict[str, list[float]] = field(default_factory=dict)  # key -> TTFTs
    refused: dict[str, int] = field(default_factory=dict)

    def p(self, key: str, q: float) -> float:
        xs = sorted(self.served.get(key, []))
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@dataclass(order=True)
class _Req:
    arrival: float
    rid: str = field(compare=False)
    key: str = field(compare=False)
    priority: int = field(compare=False)
    prompt: int = field(compare=False)
    output: int = field(compare=False)
    preemptions: int = field(compare=False, default=0)
    started: bool = field(compare=False, default=False)  # its first token was delivered


@dataclass
class _Run:
    req: _Req
    first: float  # when its first token (of this run) comes: the prefill's end
    end: float


def simulate_preemptive(
    streams: list[Stream], fairness: Fairness, setup: Setup, rule: PreemptionRule
) -> Outcome:
    """:func:`simulate` where a held head that ``rule`` lets preempt takes a running request's slot."""
    queue: HeldQueue[_Req] = make_hold_queue(fairness)
    running: dict[str, _Run] = {}
    ends: list[tuple[float, str]] = []  # (end, rid), lazily deleted
    out = Outcome()
    preempted = 0
    credits = EngineCredits()  # the engine's tenants' credit, as the live gate keeps it

    def claim(r: _Req) -> Claim:
        return Claim(r.rid, r.priority, r.key, r.arrival, r.preemptions)

    def start(r: _Req, now: float) -> None:
        prefill = r.prompt * setup.prefill_s_per_token
        run = running[r.rid] = _Run(r, now + prefill, now + prefill + r.output * setup.tpot_s)
        heapq.heappush(ends, (run.end, r.rid))
        if not r.started:
            r.started = True
            out.served.setdefault(r.key, []).append(run.first - r.arrival)

    def preempt(rid: str, now: float) -> None:
        nonlocal preempted
        run = running.pop(rid)
        r = run.req
        made = 0 if now < run.first else min(r.output - 1, 1 + int((now - run.first) / setup.tpot_s))
        r.prompt += made
        r.output -= made
        r.preemptions += 1
        preempted += 1
        queue.push(r.rid, r, r.arrival, r.priority, tenant=r.key, cost=0.0)

    def finish_until(t: float) -> None:
        while ends and ends[0][0] <= t:
            end, rid = heapq.heappop(ends)
            run = running.get(rid)
            if run is not None and run.end == end:
                del running[rid]
                dispatch(end)

    def dispatch(now: float) -> None:
        while queue:
            if len(running) < setup.slots:
                r = queue.pop()
                assert r is not None
                start(r, now)
                continue
            holders = [claim(x.req) for x in running.values()]

            def band(x: _Req, hs: list[Claim] = holders) -> dict[str, float] | None:
                return credits.band("engine", rule, now, hs, setup.slots, x.priority)

            def may(x: _Req, hs: list[Claim] = holders) -> bool:
                return may_preempt(claim(x), hs, setup.slots, rule, band(x))

            got = first_preempting(queue.items(), may, lambda x: (x.priority, x.key))
            if got is None:
                return
            victim = rule.victim(claim(got), holders, setup.slots, [claim(got)], band(got))
            assert victim is not None
            preempt(victim.key, now)  # held again, uncharged
            queue.remove(got.rid)  # out of turn: charged as a pop would
            queue.charge(got.key, weighted_tokens(got.prompt, got.output) if not got.started else 0.0)
            start(got, now)

    for r in arrivals(streams, setup):
        finish_until(r.arrival)
        if len(queue) >= setup.max_held:
            victim_key = queue.last_behind(r.priority, r.key, lambda _: True)
            if victim_key is None:
                out.refused[r.key] = out.refused.get(r.key, 0) + 1
                continue
            gone = queue.remove(victim_key)
            assert gone is not None
            out.refused[gone.key] = out.refused.get(gone.key, 0) + 1
        queue.push(r.rid, r, r.arrival, r.priority, tenant=r.key, cost=weighted_tokens(r.prompt, r.output))
        dispatch(r.arrival)
    finish_until(float("inf"))
    out.refused["preemptions"] = preempted
    return out


def arrivals(streams: list[Stream], setup: Setup) -> list[_Req]:
    rng = random.Random(setup.seed)
    out: list[_Req] = []
    for s in streams:
        t = 0.0
        srng = random.Random(f"{setup.seed}-{s.key}")
        while (t := t + srng.expovariate(s.rate)) < setup.duration_s:
            prompt = max(1, int(rng.expovariate(1 / setup.prompt_tokens)))
            output = max(1, int(rng.expovariate(1 / setup.output_tokens)))
            out.append(_Req(t, f"{s.key}-{len(out)}", s.key, s.priority, prompt, output))
    return sorted(out)


def simulate(streams: list[Stream], fairness: Fairness, setup: Setup) -> Outcome:
    queue: HeldQueue[_Req] = make_hold_queue(fairness)
    free_at: list[float] = [0.0] * setup.slots  # heap of when each slot frees
    heapq.heapify(free_at)
    out = Outcome()

    def dispatch(now: float) -> None:
        while queue and free_at[0] <= now:
            r = queue.pop()
            assert r is not None
            heapq.heappop(free_at)
            prefill = r.prompt * setup.prefill_s_per_token
            heapq.heappush(free_at, now + prefill + r.output * setup.tpot_s)
            out.served.setdefault(r.key, []).append(now - r.arrival + prefill)

    for r in arrivals(streams, setup):
        while queue and free_at[0] <= r.arrival:  # slots that freed before this arrival take the queue
            dispatch(max(free_at[0], 0.0))
        if len(queue) >= setup.max_held:
            victim = queue.last_behind(r.priority, r.key, lambda _: True)
            if victim is None:
                out.refused[r.key] = out.refused.get(r.key, 0) + 1
                continue
            gone = queue.remove(victim)
            assert gone is not None
            out.refused[gone.key] = out.refused.get(gone.key, 0) + 1
        cost = weighted_tokens(r.prompt, r.output)
        queue.push(r.rid, r, r.arrival, r.priority, tenant=r.key, cost=cost)
        dispatch(r.arrival)
    while queue:
        dispatch(free_at[0])
    return out


def run(setup: Setup) -> dict[str, Any]:
    light, heavy = Stream("light", 0.4), Stream("heavy", 4.0)
    high, low = Stream("high", 0.4, priority=1), Stream("low", 4.0, priority=0)
    twin_a, twin_b = Stream("a", 4.4), Stream("b", 4.4)
    capacity = setup.slots / (
        setup.prompt_tokens * setup.prefill_s_per_token + setup.output_tokens * setup.tpot_s
    )
    rule, no_credit = PreemptionRule(), PreemptionRule(credit_window_s=0)
    arms: dict[str, tuple[list[Stream], Fairness, str, PreemptionRule | None]] = {
        "light alone": ([light], "vtc", "light", None),
        "light + 10x heavy, none": ([light, heavy], "none", "light", None),
        "light + 10x heavy, vtc": ([light, heavy], "vtc", "light", None),
        "light + 10x heavy, vtc + preemption without credit": ([light, heavy], "vtc", "light", no_credit),
        "light + 10x heavy, vtc + preemption": ([light, heavy], "vtc", "light", rule),
        "high alone": ([high], "vtc", "high", None),
        "high + low flood, vtc": ([high, low], "vtc", "high", None),
        "high + low flood, vtc + preemption": ([high, low], "vtc", "high", rule),
        # the cost of credit: preemptions between two equal keys that each offer the light + heavy load
        "two equal keys, vtc + preemption without credit": ([twin_a, twin_b], "vtc", "a", no_credit),
        "two equal keys, vtc + preemption": ([twin_a, twin_b], "vtc", "a", rule),
    }
    rows = []
    for name, (streams, fairness, key, preempting) in arms.items():
        o = (
            simulate_preemptive(streams, fairness, setup, preempting)
            if preempting is not None
            else simulate(streams, fairness, setup)
        )
        rows.append({
            "arm": name, "key": key, "fairness": fairness, "served": len(o.served.get(key, [])),
            "p50_ttft_s": o.p(key, 0.5), "p99_ttft_s": o.p(key, 0.99),
            "refused": o.refused, "served_by_key": {k: len(v) for k, v in o.served.items()},
        })  # fmt: skip
    by: dict[str, dict[str, Any]] = {r["arm"]: r for r in rows}
    light_ratio = by["light + 10x heavy, vtc + preemption"]["p99_ttft_s"] / by["light alone"]["p99_ttft_s"]
    high_ratio = by["high + low flood, vtc + preemption"]["p99_ttft_s"] / by["high alone"]["p99_ttft_s"]
    return {
        "setup": asdict(setup),
        "capacity_req_per_s": capacity,
        "offered_req_per_s": {"light": light.rate, "heavy": heavy.rate, "high": high.rate, "low": low.rate},
        "arms": rows,
        "goals": {
            "light_p99_ratio_vtc": by["light + 10x heavy, vtc"]["p99_ttft_s"]
            / by["light alone"]["p99_ttft_s"],
            "light_p99_ratio_preemption": light_ratio,
            "light_p99_ratio_none": by["light + 10x heavy, none"]["p99_ttft_s"]
            / by["light alone"]["p99_ttft_s"],
            "light_within_1_5x": light_ratio <= 1.5,
            "high_p99_ratio_vtc": by["high + low flood, vtc"]["p99_ttft_s"] / by["high alone"]["p99_ttft_s"],
            "high_p99_ratio": high_ratio,
            "high_unchanged_within_1_5x": high_ratio <= 1.5,
        },
    }


def markdown(report: dict[str, Any]) -> str:
    s, g = report["setup"], report["goals"]
    lines = [
        "# Fairness and priority in the hold queue",
        "",
        f"{s['slots']} slots, prompt ~{s['prompt_tokens']} / output ~{s['output_tokens']} tokens (exponential), "
        f"capacity {report['capacity_req_per_s']:.2f} req/s, held at most {s['max_held']}, {s['duration_s']:.0f} s, "
        f"seed {s['seed']}; offered req/s: {report['offered_req_per_s']}.",
        "",
        "| arm | key | served | TTFT p50 s | TTFT p99 s | refused |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["arms"]:
        lines.append(
            f"| {r['arm']} | {r['key']} | {r['served']} | {r['p50_ttft_s']:.3f} | {r['p99_ttft_s']:.3f} | {r['refused']} |"
        )
    lines += [
        "",
        f"Light key p99 under the flood / alone: **{g['light_p99_ratio_preemption']:.2f}x** with vtc + "
        f"preemption ({g['light_p99_ratio_vtc']:.2f}x with vtc alone, {g['light_p99_ratio_none']:.1f}x in "
        f"arrival order); goal <= 1.5x: {g['light_within_1_5x']}.",
        f"High-priority p99 with a low-priority flood / alone: **{g['high_p99_ratio']:.2f}x** with "
        f"preemption ({g['high_p99_ratio_vtc']:.2f}x without); goal <= 1.5x: {g['high_unchanged_within_1_5x']}.",
        "",
    ]
    if "live" in report:
        lv = report["live"]
        lines += [
            f"## Live: llmfleet up --emulate {lv.get('gpus', 1)}xA100-80GB, {lv['slots']} requests at once "
            f"each, {lv['tokens']}-token streams, {lv['step_s']:.0f} s per arm × {lv.get('repeats', 1)} runs in "
            f"turn, light/high {lv['light_rate']} req/s per GPU, heavy/low 10x",
            "",
            "| arm | key | served | TTFT p50 s | TTFT p99 s | errors | the other key |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in lv["arms"]:
            other = "; ".join(f"{k}: {v['served']} served, p99 {v['p99_ttft_s']:.2f} s, {v['errors']} errors"
                              for k, v in r["others"].items())  # fmt: skip
            lines.append(
                f"| {r['arm']} | {r['key']} | {r['served']} | {r['p50_ttft_s']:.3f} | {r['p99_ttft_s']:.3f} "
                f"| {r['errors']} | {other} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Setup()
    ap.add_argument("--slots", type=int, default=d.slots)
    ap.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    ap.add_argument("--output-tokens", type=int, default=d.output_tokens)
    ap.add_argument("--prefill-s-per-token", type=float, default=d.prefill_s_per_token)
    ap.add_argument("--tpot-s", type=float, default=d.tpot_s)
    ap.add_argument("--max-held", type=int, default=d.max_held)
    ap.add_argument("--duration-s", type=float, default=d.duration_s)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--out", type=Path, default=Path(".bench/fairness"))
    ap.add_argument("--live", action="store_true", help="also run the arms on llmfleet up --emulate")
    ap.add_argument(
        "--live-slots", type=int, default=4, help="live: requests the emulated engine runs at once"
    )
    ap.add_argument("--live-step-s", type=float, default=30.0, help="live: seconds of load per arm")
    ap.add_argument(
        "--live-light-rate", type=float, default=1.5, help="live: the light key's req/s (heavy: 10x)"
    )
    ap.add_argument("--live-tokens", type=int, default=32, help="live: output tokens per request")
    ap.add_argument(
        "--live-repeats", type=int, default=1, help="live: runs of every arm, in turn, their TTFTs pooled"
    )
    ap.add_argument(
        "--live-gpus", type=int, default=1, help="live: emulated GPUs (every key's rate scales with them)"
    )
    a = ap.parse_args(argv)
    setup = Setup(a.slots, a.prompt_tokens, a.output_tokens, a.prefill_s_per_token, a.tpot_s, a.max_held,
                  a.duration_s, a.seed)  # fmt: skip
    report = run(setup)
    if a.live:
        from tools.bench.fairness_live import run_live  # starts clusters: only when asked

        report["live"] = {
            "slots": a.live_slots, "step_s": a.live_step_s, "light_rate": a.live_light_rate, "tokens": a.live_tokens,
            "repeats": a.live_repeats, "gpus": a.live_gpus,
            "arms": run_live(a.out / "live", a.live_slots, a.live_step_s, a.live_light_rate, a.live_tokens,
                             a.live_repeats, a.live_gpus),
        }  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "report.json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    (a.out / "report.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
