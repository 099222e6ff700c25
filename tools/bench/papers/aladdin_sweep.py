"""The Aladdin scenario's searches: N* (Eq. 6) from the cost model, the fewest workers of a config
reaching the target attainment (memoised simulations), and one model's sweep over its rates."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from llmfleet.costmodel import model_arch
from llmfleet.costmodel.decode_worker import decode_worker
from llmfleet.costmodel.latency_model import decode_iteration_time, latency_model
from llmfleet.policies.placement import InstancePlan, optimal_tp
from llmfleet.sim.capacity import fewest_passing
from llmfleet.sim.metrics import aladdin_ratio
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo

from . import common as C
from .aladdin_setup import (
    ENGINE,
    GPUS_PER_MACHINE,
    MAX_GPUS,
    OPEN_PAPER,
    OPEN_STRICT,
    SEARCH_PAPER,
    TARGET,
    THETA,
    THETAS,
)


def worker_sizes(arch, hw, slo, m_r: float) -> dict[str, int]:
    """N* (Eq. 6) on the bench's cost source (its decode iteration, the calibrated source's fitted
    per-iteration overhead included), with Eq. 6's memory and with the paper's M = N·m_gpu − m_model,
    and on the roofline without overhead for reference."""
    kw = {"gpus_per_node": GPUS_PER_MACHINE}
    it = decode_iteration_time(arch, hw, C.COST_SOURCE)
    return {
        "eq6": optimal_tp(arch, hw, slo, m_r, iteration_time=it, **kw),
        "paper_memory": optimal_tp(arch, hw, slo, m_r, iteration_time=it, paper_memory=True, **kw),
        "roofline": optimal_tp(arch, hw, slo, m_r, **kw),
    }


def open_row(model, rate, label, policy, tp, n, cap, at, requests, tag) -> dict:
    return {
        "model": model, "rate_rps": rate, "config": label, "workload": f"{tag}, Poisson",
        "cost_source": at.get("cost_source", C.COST_SOURCE), "policy": policy, "tp": tp,
        "workers": n, "gpus": n * tp, "gpus_used": n * tp, "pool_workers": cap, "cap_reached": n >= cap,
        "gpus_p100": n * tp if at["p100"] else None, "p100_met": bool(at["p100"]),
        "attainment": at.get("attainment"), "ttft_p99_s": at.get("ttft_p99_s"),
        "tpot_p99_ms": at.get("tpot_p99_ms"), "viol_ttft": at.get("viol_ttft"),
        "viol_atgt": at.get("viol_atgt"), "preemptions": at.get("preemptions"), "plateau": None,
        "requests": requests, "sims": 1, "tried": {str(cap): round(at["attainment"], 4)},
    }  # fmt: skip


class Search:
    """Fewest workers of ``tp`` GPUs reaching the target attainment; evaluations are memoised.
    ``decode_only``: the workers are split-phase decode instances (requests arrive prefilled,
    ``llmfleet.sim.decode_only``) and Aladdin prices them with no prefill (``costmodel.decode_worker``).

    ``stop_at_miss``: a P100 question (:meth:`ok` with ``"p100"``) about a count not yet simulated runs
    until the first request that misses the SLO, which settles it (P100 is the worst request's ratio);
    such counts are in ``missed``, not ``seen``, and every other answer is the same as a full run's."""

    def __init__(
        self, model, tp, policy, wl, slo, predict, pred, hw, mode=None, decode_only=False, stop_at_miss=False
    ) -> None:
        self.model, self.tp, self.policy, self.wl, self.mode = model, tp, policy, wl, mode or {}
        self.slo, self.predict, self.pred, self.hw = slo, predict, pred, hw
        self.decode_only = decode_only
        self.stop_at_miss = stop_at_miss
        self.seen: dict[int, dict] = {}
        self.missed: set[int] = set()  # counts whose run stopped at a request missing the SLO (P100 fails)

    def bundle(self) -> PolicyBundle:
        if self.policy == "aladdin_bestfit":  # priced as the simulator charges the engines
            lm = latency_model(model_arch(self.model), self.hw, self.tp, C.COST_SOURCE)
            lat = {self.model: decode_worker(lm) if self.decode_only else lm}
            opts = {
                "latency_models": lat,
                "slos": {self.model: self.slo},
                "predictor": self.pred,
                "theta": THETA,
                **self.mode,
            }
            engine = {"policy": "fcfs", "options": ENGINE}
            return PolicyBundle(
                "aladdin", dispatch={"policy": "aladdin_bestfit", "options": opts}, engine=engine
            )
        return PolicyBundle(self.policy, dispatch=self.policy, engine={"policy": "fcfs", "options": ENGINE})

    def _simulate(self, n: int, stop_at_miss: bool = False) -> Any:
        slo = Slo(ttft_s=self.slo[0], tpot_s=self.slo[1])
        svc = SimService("chat", self.model, slo, max_tokens=2048)
        engine = EngineSettings(decode_only=self.decode_only)
        spec = SimSpec(ClusterSpec(n * self.tp, self.hw), (svc,), engine)
        plan = [InstancePlan(f"w{i:03d}", (self.model,), self.tp) for i in range(n)]
        stop = (lambda r: aladdin_ratio(r, slo) > 1.0) if stop_at_miss else None
        return C.simulate(
            spec, self.wl, self.bundle(), plan=plan, predict=self.predict, samples=10, stop=stop
        )

    def eval(self, n: int) -> dict:
        if n not in self.seen:
            self._measure(n, self._simulate(n))
        return self.seen[n]

    def p100(self, n: int) -> bool:
        """Whether P100 holds with n workers (a run stopped at a miss where ``stop_at_miss``)."""
        if n in self.seen or not self.stop_at_miss:
            return bool(self.eval(n)["p100"])
        if n not in self.missed:
            e = self._simulate(n, stop_at_miss=True)
            if e.result.stopped_s is None:  # no request missed: the full run
                self._measure(n, e)
            else:
                self.missed.add(n)
        return n not in self.missed and bool(self.seen[n]["p100"])

    def adopt(self, other: Search, n: int) -> None:
        """``other``'s full run with n workers as this search's: the same config on the same workload
        runs the same simulation."""
        mine = (self.model, self.tp, self.policy, self.mode, self.slo, self.decode_only)
        if (other.model, other.tp, other.policy, other.mode, other.slo, other.decode_only) != mine or (
            other.wl is not self.wl
        ):
            raise ValueError("adopt takes a run of the same config on the same workload")
        self.seen[n] = other.eval(n)

    def p100_by_n(self) -> dict[int, bool]:
        """P100 at every count run, fully or up to a miss."""
        return {**dict.fromkeys(self.missed, False), **{m: bool(v["p100"]) for m, v in self.seen.items()}}

    def _measure(self, n: int, e: Any) -> None:
        """``seen[n]``: what the bench reads of the full run ``e`` with n workers."""
        o = e.report["overall"]
        used = sum(i["tp"] for i in e.result.instances if i["iterations"] > 0)
        recs = e.result.records
        done = [r for r in recs if r.done]
        span = max((r.finish_s for r in done), default=0.0) - min(r.arrival_s for r in recs)
        self.seen[n] = {
            "viol_ttft": sum(r.ttft_s > self.slo[0] for r in done) / max(1, len(recs)),
            "viol_atgt": sum(r.tpot_s > self.slo[1] for r in done) / max(1, len(recs)),
            "preemptions": o["preemptions"],
            "attainment": o["slo"]["aladdin"],
            "gpus_used": used,
            # workers running an iteration, averaged over first arrival → last finish
            "busy_workers": sum(i["busy_s"] for i in e.result.instances) / span if span > 0 else 0.0,
            "ttft_p99_s": o["ttft_s"]["p99"],
            "tpot_p99_ms": 1e3 * o["tpot_s"]["p99"],
            "failed": o["failed"],
            # Aladdin's attainment at P100 / P99: the percentile of max(TTFT/T_pre, ATGT/T_dec) <= 1
            "p100": o["aladdin_at"]["p100"]["met"],
            "p99": o["aladdin_at"]["p99"]["met"],
            "ratio_p100": o["aladdin_at"]["p100"]["ratio"],
            "ratio_p99": o["aladdin_at"]["p99"]["ratio"],
            "cost_source": "/".join(sorted(set(e.report.get("cost_models", {}).values()))) or C.COST_SOURCE,
        }

    def ok(self, n: int, key: str = "p99") -> bool:
        if key == "p99":
            return self.eval(n)["attainment"] >= TARGET
        if key == "p100":
            return self.p100(n)
        return bool(self.eval(n)[key])

    def run(self, guess: int, key: str = "p99", cap: int | None = None) -> int | None:
        """Gallop and bisection (``fewest_passing``) up to ``cap`` workers (default the search's bound)."""
        return fewest_passing(lambda n: self.ok(n, key), guess, cap or max(1, MAX_GPUS // self.tp))


def searched_row(model, rate, label, policy, tp, n, n100, at, s: Search, requests, tag) -> dict:
    """The row of a config whose workers were searched (``n`` at P99, ``n100`` at P100; None: not found)."""
    return {
        "model": model,
        "rate_rps": rate,
        "config": label,
        "workload": f"{tag}, Poisson",
        "cost_source": at.get("cost_source", C.COST_SOURCE),
        "policy": policy,
        "tp": tp,
        "workers": n,
        "gpus": n * tp if n is not None else None,
        "gpus_used": at.get("gpus_used"),
        "gpus_p100": n100 * tp if n100 is not None else None,
        "attainment": at.get("attainment"),
        "ttft_p99_s": at.get("ttft_p99_s"),
        "tpot_p99_ms": at.get("tpot_p99_ms"),
        "viol_ttft": at.get("viol_ttft"),
        "viol_atgt": at.get("viol_atgt"),
        "preemptions": at.get("preemptions"),
        "plateau": None if n is not None else max(v["attainment"] for v in s.seen.values()),
        "requests": requests,
        "sims": len(s.seen),
        "tried": {str(k): round(v["attainment"], 4) for k, v in sorted(s.seen.items())},
    }


@dataclasses.dataclass
class ModelSweep:
    """One model's sweep over its rates (call :meth:`rate` in rate order): every config's GPUs at P99 and
    P100, each search starting from the previous rate's answer scaled by the rate."""

    model: str
    mc: dict[str, Any]
    n_star: int
    hw: Any
    pred: Any
    predict: Any
    tag: str
    log: C.Log
    guess: dict[str, int] = dataclasses.field(default_factory=dict)
    prev_rate: float | None = None

    def configs(self, top: bool) -> list[tuple[str, str, int, dict | None]]:
        """(label, dispatch policy, TP, Aladdin options) of every config; at the top rate also θ and (d),
        one factor at a time."""
        n_star, paper_tp = self.n_star, self.mc["paper_tp"]
        configs = [
            ("jsq-opt", "jsq", n_star, None),
            ("aladdin", "aladdin_bestfit", n_star, OPEN_PAPER),
            ("aladdin-strict", "aladdin_bestfit", n_star, OPEN_STRICT),
            ("aladdin-search", "aladdin_bestfit", n_star, SEARCH_PAPER),
        ]
        if n_star != GPUS_PER_MACHINE:
            configs.append(("vllm-default", "jsq", GPUS_PER_MACHINE, None))
        if paper_tp != n_star:
            configs += [
                (f"jsq@{paper_tp}gpu", "jsq", paper_tp, None),
                (f"aladdin@{paper_tp}gpu", "aladdin_bestfit", paper_tp, OPEN_PAPER),
            ]
        if top:
            configs += [
                (f"aladdin θ={t:g}", "aladdin_bestfit", n_star, {**OPEN_PAPER, "theta": t}) for t in THETAS
            ]
            configs.append(("aladdin no-(d)", "aladdin_bestfit", n_star, {**OPEN_PAPER, "protect": False}))
        return configs

    def rate(self, rate: float, wl: Any, top: bool) -> list[dict]:
        """Every config's row at one rate on the workload ``wl``."""
        rows: list[dict] = []
        jsq100: dict[int, int] = {}
        for label, policy, tp, mode in self.configs(top):
            s = Search(self.model, tp, policy, wl, self.mc["slo"], self.predict, self.pred, self.hw, mode)
            if mode is not None and mode.get("on_infeasible") == "open":
                rows.append(self._opened(s, rate, label, policy, jsq100, len(wl)))
            else:
                rows += self._searched(s, rate, label, policy, jsq100, len(wl))
        self.prev_rate = rate
        return rows

    def _opened(self, s: Search, rate: float, label: str, policy: str, jsq100: dict, requests: int) -> dict:
        """The paper's count: a pool larger than needed, best fit opens workers as it must."""
        tp = s.tp
        cap = min(MAX_GPUS // tp, max(8, 2 * jsq100.get(tp, 4) + 2))
        at = s.eval(cap)
        n = at["gpus_used"] // tp
        row = open_row(self.model, rate, label, policy, tp, n, cap, at, requests, self.tag)
        self.log(f"  aladdin {self.model} {rate:g} req/s {label:14s} TP{tp}: opened {n * tp} GPUs "
                 f"(P100 {'met' if at['p100'] else 'not met'}, P99 {at['attainment']:.4f})")  # fmt: skip
        return row

    def _searched(
        self, s: Search, rate: float, label: str, policy: str, jsq100: dict, requests: int
    ) -> list[dict]:
        """Fewest workers at P99, then at P100 (reusing the P99 evaluations)."""
        tp = s.tp
        base = self.guess.get(label) or self.guess.get(label.replace("aladdin-search", "jsq-opt"))
        g = math.ceil(base * rate / self.prev_rate) if base and self.prev_rate else (base or 1)
        n = s.run(g)
        if n is not None:
            self.guess[label] = n
        n100 = s.run(n or g, "p100")  # memoised: the P100 search reuses the P99 evaluations
        if policy == "jsq" and n100 is not None:
            jsq100[tp] = n100
        at = s.eval(n) if n is not None else {}
        rows = [searched_row(self.model, rate, label, policy, tp, n, n100, at, s, requests, self.tag)]
        if label == "jsq-opt" and self.n_star == GPUS_PER_MACHINE:
            rows.append({**rows[-1], "config": "vllm-default", "same_as": "jsq-opt"})
        self.log(
            f"  aladdin {self.model} {rate:g} req/s {label:14s} TP{tp}: "
            f"{'>' + str(MAX_GPUS) if n is None else n * tp} GPUs at P99, "
            f"{'>' + str(MAX_GPUS) if n100 is None else n100 * tp} at P100 ({len(s.seen)} sims)"
        )
        return rows


@dataclasses.dataclass
class Headline:
    """One model's P100 answer at one rate on several seeds, each answer checked at n − 1 and n + 1:
    ``searches`` holds one :class:`Search` per seed (same config, the seed's workload)."""

    label: str
    searches: list[Search]

    def fewest(self, guess: int, cap: int | None = None) -> dict:
        """The fewest workers n (≤ ``cap``, default the search's bound) at which P100 holds on every seed
        at n and at n + 1: JSQ's count, and best fit's when its pool is sized to the workload, as the
        paper's N_w is. P100 is not monotone in the count (a different count changes which requests
        collide), so a bisection alone can land on a lucky or an unlucky count: each seed's bisection
        from ``guess`` gives a start, half the smallest of them, and the counts from there are scanned
        in order. ``per_seed``: each seed's own fewest such count; ``p100_by_n``: every count scanned."""
        top = cap or max(1, MAX_GPUS // self.searches[0].tp)
        found = [n for n in (s.run(guess, "p100", top) for s in self.searches) if n is not None]
        start = max(1, min(found, default=top) // 2)

        def holds(s: Search, m: int) -> bool:
            return s.ok(m, "p100") and s.ok(m + 1, "p100")

        per_seed = [next((m for m in range(start, top) if holds(s, m)), None) for s in self.searches]
        each = [m for m in per_seed if m is not None]
        n = max(each) if len(each) == len(per_seed) else None
        while n is not None and not all(holds(s, n) for s in self.searches):
            n = n + 1 if n + 1 < top else None
        out = self._checked(n, per_seed)
        known = [s.p100_by_n() for s in self.searches]
        out["p100_by_n"] = {str(m): [k.get(m) for k in known] for m in sorted(set().union(*known))}
        return out

    def opened(self, pool: int) -> dict:
        """Best fit that opens workers, on a pool of ``pool``: the most it opened over the seeds."""
        at = [s.eval(pool) for s in self.searches]
        tp = self.searches[0].tp
        per_seed = [a["gpus_used"] // tp for a in at]
        out = self._checked(max(per_seed), per_seed)
        out["p100_opened"] = [bool(a["p100"]) for a in at]  # P100 with the pool it could open from
        out["pool_workers"] = pool
        return out

    def _checked(self, n: int | None, per_seed: list[int | None]) -> dict:
        """P100 on every seed at n − 1, n and n + 1 workers (a pool of exactly that many), and the
        time-averaged busy workers at n."""
        tp = self.searches[0].tp
        out: dict[str, Any] = {"config": self.label, "tp": tp, "workers": n, "per_seed": per_seed}
        if n is None:
            return out
        for k, m in (("below", n - 1), ("at", n), ("above", n + 1)):
            out[f"p100_{k}"] = [s.p100(m) for s in self.searches] if m >= 1 else []
        out["gpus"] = n * tp
        out["busy_workers"] = [round(s.eval(n)["busy_workers"], 2) for s in self.searches]
        out["ratio_p100"] = [s.eval(n)["ratio_p100"] for s in self.searches]
        out["holds"] = all(out["p100_at"]) and all(out["p100_above"])
        out["tight"] = not out["p100_below"] or not all(out["p100_below"])
        return out
