"""SeaLLM (service-aware sharing of several LLMs): normalized latency, p99 latency and SLO attainment.

The setup is ``seallm_setup`` (paper §6.1 quoted there, shared with ``placement_bench.py``): 32 A100-80GB,
OPT-6.7B and Llama2-7B/13B/70B on k-means clusters of ShareGPT-like (Table 1 means) ∪ LongBench-like
lengths, each cluster given a model by a seeded random assignment (``assignments``, at least four in the
full run: "For each request group, we randomly assign an LLM"), per-service rates from function
popularity dealt round-robin (MAF counts with ``--popularity PATH``, else a Zipf law matched to MAF's
published tail), each service its own bursty Gamma process, 2–50 req/s, 300 s of arrivals per rate. The
conv trace's lengths in place of ShareGPT-like ones are the ``conv`` variant, run at ``conv_rates``.
Each rate is reported with its offered load relative to the cluster's capacity (``load``,
``seallm_setup.offered_load``).

Metrics (paper §6.1 "Metrics"): normalized latency (latency ÷ the service's mean execution time, each
request's solo time at its model's reference TP, the same for every system: ``SimSpec.reference_tps``),
the 99th-percentile latency, SLO attainment with SLO = 5 × the request's execution time
(``sim.metrics``). We also give p99 of the normalized latency, and the drain (completion of the last
request − end of the arrivals): a drain that grows with the run means the queue never settles, and then
every ratio grows with the run length, which ``run_length`` measures at one rate.

Policies: ``vllm`` (``vllm-v0.4``: even split as TP-1/2 replicas, FCFS one phase per iteration, fewest
requests — the paper's vLLM, "We allocate the GPUs evenly to LLM services"), ``vllm-tp`` (the same engines
as one server per model at TP = its even share, TP 8), ``seallm`` (Algorithm 1, ≤ 2 services per engine,
searched once per rate on a separate 60 s history of the same processes with the preset's own engines,
then fixed: the paper's SeaLLM-A, doubling budget with its default admission, fewest requests),
``seallm-f`` (SeaLLM-F: the same plan and dispatch on vLLM's FCFS engines), ``seallm-literal`` and
``seallm-prefill_first`` (the doubling budget's other ``admission`` options on the same plan), and on the first
assignment only ``alpaserve`` (``alpaserve-v0.4``: all models on every instance, unified KV, FCFS — "we
implement AlpaServe with our unified KV cache and FCFS"), ``muxserve`` (colocated, round-robin prefill)
and ``seallm-colocated`` (DB on all-models-everywhere: the scheduling effect alone, beside AlpaServe);
at ``adaptive_rates`` (first assignment) ``seallm-adaptive`` (the ``seallm-placement`` preset:
Algorithm 1 re-run during the run on the last interval's arrivals, adaptive interval Eq. 8, β = 0.1:
SeaLLM with both of its parts). The adaptive preset re-searches every ~50 s (~100 simulations of the
window each), which is why the sweep uses the fixed plan.
"""

from __future__ import annotations

# The summary (ratios, goal, notes) is seallm_summary; the setup is seallm_setup.
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import preset

from . import common as C
from . import seallm_setup as S
from .seallm_summary import CLAIM
from .seallm_summary import summarize as _summarize

__all__ = [
    "CLAIM", "COLUMNS", "NAME", "POLICIES", "TITLE", "combine", "markdown", "parts", "plot", "run", "run_part", "settings",
]  # fmt: skip

NAME = "seallm"
TITLE = "SeaLLM — sharing 4 LLMs on 32 A100-80GB (normalized latency, p99, SLO attainment)"
POLICIES = (
    "vllm",
    "vllm-tp",
    "seallm",
    "seallm-f",
    "seallm-literal",
    "seallm-prefill_first",
)  # every assignment
BASELINES = ("alpaserve", "muxserve", "seallm-colocated")  # the first assignment only
CONV_POLICIES = ("vllm", "vllm-tp", "seallm", "seallm-f")  # the conv-trace variant
POPULARITY: Path | None = None  # set by run.py --popularity: MAF function counts instead of the Zipf law
LENGTH_RATE = 30.0  # req/s of the run-length study (fixed before any run)
ADAPTIVE_RATES = (5.0, 20.0)  # where the adaptive preset also runs (CPU budget, see the module doc)
CONV_RATES = (5.0, 20.0)  # where the conv-trace variant runs


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"rates": (4.0,), "horizon_s": 4.0, "lengths": (), "length_rate": 4.0, "adaptive_rates": (),
                "history_s": 4.0, "assignments": (0,), "conv_rates": (4.0,)}  # fmt: skip
    if quick:
        return {"rates": (10.0, 30.0), "horizon_s": 60.0, "lengths": (), "length_rate": 30.0,
                "adaptive_rates": (), "history_s": 30.0, "assignments": (0, 1), "conv_rates": ()}  # fmt: skip
    return {"rates": S.RATES, "horizon_s": S.HORIZON_S, "lengths": (60.0, 120.0, 300.0, 600.0),
            "length_rate": LENGTH_RATE, "adaptive_rates": ADAPTIVE_RATES, "history_s": S.HISTORY_S,
            "assignments": S.ASSIGNMENTS, "conv_rates": CONV_RATES}  # fmt: skip


def _systems() -> dict:
    b, factory = S.seallm()
    return {
        "vllm": (S.vllm(), None),
        "vllm-tp": (dataclasses.replace(S.vllm(), name="vllm-tp"), None),
        "alpaserve": (preset("alpaserve-v0.4"), None),
        "muxserve": (preset("muxserve"), None),
        "seallm-colocated": (preset("seallm"), None),
        "seallm": (S.seallm_fixed(), None),
        "seallm-f": (S.seallm_fcfs(), None),
        "seallm-literal": (S.seallm_fixed("literal"), None),
        "seallm-prefill_first": (S.seallm_fixed("prefill_first"), None),
        "seallm-adaptive": (b, factory),
    }


FIXED_PLAN = ("seallm", "seallm-f", "seallm-literal", "seallm-prefill_first")  # run on Algorithm 1's plan


def _run_one(sp, wl, bundle, factory, horizon: float, plan=None) -> dict:
    e = C.simulate(sp, wl, bundle, samples=40, evaluator_factory=factory, plan=plan)
    m = C.metrics(e)
    m["drain_s"] = max(0.0, m["makespan_s"] - horizon)
    plans = e.report.get("placement") or []
    m["replans"] = sum(1 for p in plans if p.get("status") == "applied")
    m["last_plan"] = plans[-1]["plan"] if plans else ""
    return m


@dataclasses.dataclass
class _Sweep:
    """One (lengths, assignment)'s runs on the SeaLLM setup: the systems, and Algorithm 1's plan per rate
    (searched once, on a separate history of the same processes)."""

    cfg: dict[str, Any]
    lengths: str
    assignment: int
    sp: Any
    pools: dict[str, Any]
    share: dict[str, float]
    systems: dict[str, Any]
    log: C.Log
    plans: dict[float, Any] = dataclasses.field(default_factory=dict)

    def plan_at(self, rate: float, i: int):
        """Algorithm 1's plan at ``rate`` (searched here unless a search part's result was given)."""
        cfg, plans, log = self.cfg, self.plans, self.log
        if rate not in plans:
            history = S.workload(self.pools, self.share, rate, cfg["history_s"], seed=500 + i)
            t1 = time.perf_counter()
            plans[rate] = S.place(self.sp, history)
            log(f"  seallm {self.tag} Algorithm 1 at {rate:g} req/s [{time.perf_counter() - t1:.0f}s]: "
                f"{plans[rate][1]}")  # fmt: skip
        return plans[rate][0]

    @property
    def tag(self) -> str:
        return f"{self.lengths}/a{self.assignment}"

    def run_policy(self, name: str, rate: float, i: int, wl: Any) -> dict:
        bundle, factory = self.systems[name]
        plan = self.plan_at(rate, i) if name in FIXED_PLAN else None
        if name == "vllm-tp":
            plan = S.vllm_share_plan(self.sp)
        return _run_one(self.sp, wl, bundle, factory, self.cfg["horizon_s"], plan)

    def at(self, rate: float, names: tuple[str, ...]) -> dict[str, dict]:
        """``names``' rows at ``rate`` (each rate's workload and history are seeded by the rate's index)."""
        cfg, log = self.cfg, self.log
        i = rate_index(rate)
        wl = S.workload(self.pools, self.share, rate, cfg["horizon_s"], seed=100 + i)
        load = S.offered_load(self.sp, self.pools, self.share, rate, C.COST_SOURCE)
        out = {}
        for name in names:
            t1 = time.perf_counter()
            m = self.run_policy(name, rate, i, wl)
            out[name] = {"lengths": self.lengths, "assignment": self.assignment, "rate_rps": rate, "load": load,
                         "policy": name, "horizon_s": cfg["horizon_s"], **m}  # fmt: skip
            log(
                f"  seallm {self.tag} {rate:g} req/s (load {load:.2f}, {len(wl)} req) {name:16s} "
                f"norm {m['norm_latency_mean']:.2f} p99 {m['latency_p99_s']:.1f}s slo {m['slo_seallm']:.3f} "
                f"drain {m['drain_s']:.0f}s [{time.perf_counter() - t1:.0f}s]"
            )
        return out

    def run_lengths(self, plan_index: int) -> list[dict]:
        """vLLM and SeaLLM at ``length_rate`` for longer and longer arrivals, SeaLLM on Algorithm 1's plan
        searched on the history of ``plan_index`` (the sweep's own where it runs that rate)."""
        cfg, log = self.cfg, self.log
        lengths = []
        for h in cfg["lengths"]:
            wl = S.workload(self.pools, self.share, cfg["length_rate"], h, seed=999)
            entry = {"horizon_s": h, "rate_rps": cfg["length_rate"], "requests": len(wl)}
            for name in ("vllm", "seallm"):
                bundle, factory = self.systems[name]
                plan = self.plan_at(cfg["length_rate"], plan_index) if name == "seallm" else None
                m = _run_one(self.sp, wl, bundle, factory, h, plan)
                entry.update({f"{name}_{k}": m[k] for k in ("norm_latency_mean", "latency_p99_s", "drain_s")})
            entry["norm_ratio"] = C.ratio(entry["vllm_norm_latency_mean"], entry["seallm_norm_latency_mean"])
            entry["p99_ratio"] = C.ratio(entry["vllm_latency_p99_s"], entry["seallm_latency_p99_s"])
            lengths.append(entry)
            log(f"  seallm run length {h:g}s at {cfg['length_rate']:g} req/s: ×{C.fmt(entry['norm_ratio'])} mean, "
                f"×{C.fmt(entry['p99_ratio'])} p99")  # fmt: skip
        return lengths


def make_sweep(cfg: dict, lengths: str, assignment: int, share: dict, log: C.Log) -> _Sweep:
    trace = str(C.TRACE) if lengths == "conv" else ""
    return _Sweep(cfg, lengths, assignment, S.spec(assignment), _pools(lengths, assignment, trace), share,
                  _systems(), log)  # fmt: skip


@functools.cache
def _pools(lengths: str, assignment: int, trace: str) -> dict[str, Any]:
    """A sweep's per-service length pools (the k-means of ``seallm_setup.length_pools``), built once per
    process for the pieces of a sweep that run there (``trace``: the conv trace's path, for ``conv``)."""
    conv = C.conv_trace(trace) if lengths == "conv" else None
    return S.length_pools(S.short_lengths(lengths, conv), S.spec(assignment))


def _services(sw: _Sweep) -> list[dict]:
    return [
        {
            "lengths": sw.lengths,
            "assignment": sw.assignment,
            "service": s.name,
            "model": s.model,
            "share": sw.share[s.name],
            "mean_prompt": float(sw.pools[s.name][1][:, 0].mean()),
            "mean_output": float(sw.pools[s.name][1][:, 1].mean()),
        }
        for s in sw.sp.services
    ]


def _sweeps(cfg: dict) -> list[tuple[str, int, tuple[float, ...], tuple[str, ...]]]:
    """(lengths, assignment, rates, systems) of each independent sweep: every assignment on the
    headline lengths, then the conv variant on the first assignment."""
    out: list[tuple[str, int, tuple[float, ...], tuple[str, ...]]] = [
        (S.LENGTHS[0], a, cfg["rates"], POLICIES) for a in cfg["assignments"]
    ]
    if cfg["conv_rates"]:
        out.append(("conv", cfg["assignments"][0], cfg["conv_rates"], CONV_POLICIES))
    return out


def rate_index(rate: float) -> int:
    """A rate's index, which seeds its workload and Algorithm 1's history."""
    return S.RATES.index(rate) if rate in S.RATES else len(S.RATES) + int(rate)


def _first(cfg: dict, kind: str, a: int) -> bool:
    """The sweep that also runs the baselines, the adaptive preset and the run-length study."""
    return kind == S.LENGTHS[0] and a == cfg["assignments"][0]


def _jobs(cfg: dict) -> list[tuple[str, int, float, str]]:
    """The pieces, (lengths, assignment, rate, group), in the in-process run's order: per sweep and rate
    the systems on no plan of Algorithm 1 (``free``), Algorithm 1's search (``search``), then each system
    on its plan (the group is the system's name: it takes the search's result, see :func:`_after`), the
    adaptive preset (``adaptive``); then the sweep's run-length study (``lengths``)."""
    out = []
    for kind, a, rates, _ in _sweeps(cfg):
        for rate in rates:
            if _names(cfg, kind, a, rate, "free"):
                out.append((kind, a, rate, "free"))
            on_plan = _names(cfg, kind, a, rate, "plan")
            if on_plan:
                out += [(kind, a, rate, "search"), *((kind, a, rate, n) for n in on_plan)]
            if _first(cfg, kind, a) and rate in cfg["adaptive_rates"]:
                out.append((kind, a, rate, "adaptive"))
        if _first(cfg, kind, a) and cfg["lengths"]:
            out.append((kind, a, cfg["length_rate"], "lengths"))
    return out


def _after(cfg: dict, job: tuple[str, int, float, str]) -> tuple[str, ...]:
    """The search whose plan a piece takes: a system on Algorithm 1's plan, and the run-length study
    where its sweep searched that rate (else the study searches its own history, seeded apart)."""
    kind, a, rate, group = job
    search = (kind, a, rate, "search")
    if group in FIXED_PLAN or (group == "lengths" and search in _jobs_searched(cfg)):
        return (_key(search),)
    return ()


def _jobs_searched(cfg: dict) -> set[tuple[str, int, float, str]]:
    return {
        (kind, a, rate, "search") for kind, a, rates, _ in _sweeps(cfg) for rate in rates
        if _names(cfg, kind, a, rate, "plan")
    }  # fmt: skip


def _systems_at(cfg: dict, kind: str, a: int) -> tuple[str, ...]:
    """A sweep's systems at every rate, in the order of its rows (the adaptive preset's are apart)."""
    names = next(n for k, x, _, n in _sweeps(cfg) if (k, x) == (kind, a))
    return names + (BASELINES if _first(cfg, kind, a) else ())


def _names(cfg: dict, kind: str, a: int, rate: float, group: str) -> tuple[str, ...]:
    """The systems of one piece (``plan``: every system on Algorithm 1's plan)."""
    if group == "adaptive":
        return ("seallm-adaptive",)
    if group in FIXED_PLAN:
        return (group,)
    return tuple(n for n in _systems_at(cfg, kind, a) if (n in FIXED_PLAN) == (group == "plan"))


def _key(job: tuple[str, int, float, str]) -> str:
    kind, a, rate, group = job
    return f"{kind}/a{a}/{rate:g}/{group}"


def _part(
    cfg: dict, job: tuple[str, int, float, str], log: C.Log, before: dict[str, dict] | None = None
) -> dict:
    """One piece's rows (by system), plans and services, or the run-length study, or Algorithm 1's plan
    (``search``: ``searched`` holds it as (rate, [[instance, models, tp], ...], reason)). ``before``: the
    results of the pieces :func:`_after` names (their searched plans are used, not searched again)."""
    kind, a, rate, group = job
    share = S.shares(S.popularity(POPULARITY))
    sw = make_sweep(cfg, kind, a, share, log)
    for got in (before or {}).values():
        r, plan, why = got["searched"]
        sw.plans[r] = ([InstancePlan(i, tuple(m), tp) for i, m, tp in plan], why)
    out: dict[str, Any] = {"services": _services(sw)}
    if group == "lengths":
        rates = next(r for k, x, r, _ in _sweeps(cfg) if (k, x) == (kind, a))
        out["run_length"] = sw.run_lengths(rate_index(rate) if rate in rates else 99)
    elif group == "search":
        sw.plan_at(rate, rate_index(rate))
        plan, why = sw.plans[rate]
        out["searched"] = (rate, [[p.instance_id, list(p.models), p.tp] for p in plan], why)
    else:
        out["rows"] = sw.at(rate, _names(cfg, kind, a, rate, group))
    out["plans"] = {
        f"{sw.tag}@{r:g}": {
            "plan": [f"{p.instance_id}: tp{p.tp} {'+'.join(p.models)}" for p in pl],
            "reason": why,
        }
        for r, (pl, why) in sw.plans.items()
    }
    return out


# expected CPU seconds of a piece at a rate of r req/s, 300 s of arrivals and 60 s of history (the search:
# about 280 CPU-s at 50 req/s; the other groups from the previous round's full run; a system on
# Algorithm 1's plan: any of FIXED_PLAN). They only order the pool's queue.
GROUP_SECONDS = {
    "free": lambda r: 10.0 + 3.0 * r,
    "search": lambda r: 10.0 + 0.1 * r**2,
    "on plan": lambda r: 2.0 + 0.1 * r**2,
    "adaptive": lambda r: 40.0 * r,
    "lengths": lambda r: 20.0 + 20.0 * r,
}


def parts(quick: bool = False, tiny: bool = False) -> list[tuple[str, float, tuple, tuple[str, ...]]]:
    """One unit per piece (see :func:`_jobs`) for run.py's pool: (key, expected seconds, job, the keys of
    the pieces it takes results from)."""
    cfg = settings(quick, tiny)
    scale = cfg["horizon_s"] / S.HORIZON_S
    return [
        (_key(job), GROUP_SECONDS["on plan" if job[3] in FIXED_PLAN else job[3]](job[2]) * scale,
         (quick, tiny, job), _after(cfg, job))
        for job in _jobs(cfg)
    ]  # fmt: skip


def run_part(args: tuple, before: dict[str, dict] | None = None) -> dict:
    """One piece (see :func:`parts`); ``before``: the results of the pieces it names."""
    quick, tiny, job = args
    return _part(settings(quick, tiny), job, C.worker_log, before)


def run(quick: bool = False, log: C.Log = print, tiny: bool = False, cfg: dict | None = None) -> dict:
    """Every sweep in this process with ``settings(quick, tiny)`` or ``cfg`` (``seallm_sweep.py``)."""
    t0 = time.perf_counter()
    cfg = cfg or settings(quick, tiny)
    out: dict[str, dict] = {}
    for job in _jobs(cfg):  # a search comes before the pieces that take its plan
        out[_key(job)] = _part(cfg, job, log, {k: out[k] for k in _after(cfg, job)})
    result = _combine(cfg, out)
    result["wall_s"] = time.perf_counter() - t0
    return result


def combine(results: dict[str, dict], quick: bool = False, tiny: bool = False, log: C.Log = print) -> dict:
    """The paper's result from its sweeps (``results``: key → :func:`run_part`'s dict, any order)."""
    return _combine(settings(quick, tiny), results)


def _combine(cfg: dict, results: dict[str, dict]) -> dict:
    pop = S.popularity(POPULARITY)
    services, rows, adaptive, plans, run_length = [], [], [], {}, []
    for kind, a, rates, _ in _sweeps(cfg):
        jobs = [j for j in _jobs(cfg) if j[:2] == (kind, a)]
        services += results[_key(jobs[0])]["services"]
        for rate in rates:
            got = [results[_key(j)] for j in jobs if j[2] == rate and j[3] not in ("lengths", "search")]
            by_name = {n: r for g in got for n, r in g["rows"].items()}
            rows += [by_name[n] for n in _systems_at(cfg, kind, a) if n in by_name]
            adaptive += [by_name[n] for n in by_name if n == "seallm-adaptive"]
        for j in jobs:  # the sweep's plans by rate, then the run-length study's if it searched its own
            plans.update({k: v for k, v in results[_key(j)]["plans"].items() if k not in plans})
            run_length += results[_key(j)].get("run_length", [])
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": _setup(cfg, services, pop),
        "workload": f"ShareGPT-like (Table 1)∪LongBench-like k-means×4, {len(cfg['assignments'])} random model "
        f"assignments, {pop.source} round-robin, Gamma CV {S.ARRIVAL_CV:g}; conv-trace variant",
        "cost_source": C.COST_SOURCE,
        "services": services,
        "rows": rows,
        "adaptive": adaptive,
        "plans": plans,
        "run_length": run_length,
        "wall_s": 0.0,
    }
    _summarize(result)
    return result


def _setup(cfg: dict[str, Any], services: list[dict], pop: Any) -> dict[str, str]:
    first = [s for s in services if s["lengths"] == S.LENGTHS[0] and s["assignment"] == cfg["assignments"][0]]
    assigned = sorted({(s["assignment"], s["lengths"]) for s in services})
    return {
        "cluster": f"{S.CLUSTER} (8 per node)",
        "services": ", ".join(
            f"{s['service']}→{s['model']} ({s['share']:.1%} of the rate, mean in/out "
            f"{s['mean_prompt']:.0f}/{s['mean_output']:.0f} tok)"
            for s in first
        ),
        "assignments": "; ".join(
            f"{kind} a{a}: "
            + ", ".join(
                f"{s['service']}→{s['model']}"
                for s in services
                if s["assignment"] == a and s["lengths"] == kind
            )
            for a, kind in assigned
        ),
        "workload": f"per-service shares from {pop.source} dealt round-robin (MAF's functions → services); "
        f"each service its own Gamma process (CV {S.ARRIVAL_CV:g}); {cfg['horizon_s']:g} s of arrivals per rate",
        "SLO": "5 × the request's solo execution time at its model's reference TP",
        "normalized latency": "latency ÷ the service's mean solo time at the reference, the same for every "
        "system: "
        + ", ".join(f"{r['model']} TP {r['tp']} on {r['hardware']}" for r in S.spec().normalized_reference()),
        "engines": "vllm/vllm-tp/alpaserve/seallm-f: FCFS one phase per iteration (vLLM 0.2–0.4); seallm: "
        "Algorithm 1 (≤ 2 services per engine) searched once, doubling budget (default admission)",
        "cost model": C.cost_label(),
    }


COLUMNS = (
    ("lengths", "lengths", ""),
    ("assign.", "assignment", ""),
    ("req/s", "rate_rps", ".0f"),
    ("load", "load", ".2f"),
    ("policy", "policy", ""),
    ("norm. latency", "norm_latency_mean", ".2f"),
    ("norm. p99", "norm_latency_p99", ".1f"),
    ("p99 latency s", "latency_p99_s", ".1f"),
    ("SLO attain. (5×)", "slo_seallm", ".3f"),
    ("TTFT s", "ttft_mean_s", ".2f"),
    ("TPOT ms", "tpot_mean_ms", ".1f"),
    ("drain s", "drain_s", ".0f"),
    ("done", "completed", ""),
)


def markdown(res: dict) -> str:
    extra = ["Ratios per rate (baseline ÷ SeaLLM for latencies, SeaLLM ÷ baseline for SLO):", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("lengths", "lengths", ""),
                ("assign.", "assignment", ""),
                ("req/s", "rate_rps", ".0f"),
                ("load", "load", ".2f"),
                ("norm vLLM/S", "norm_vllm_over_seallm", ".2f"),
                ("norm vLLM-TP/S", "norm_vllm-tp_over_seallm", ".2f"),
                ("norm F/S", "norm_seallm-f_over_seallm", ".2f"),
                ("norm literal/S", "norm_seallm-literal_over_seallm", ".2f"),
                ("norm prefill_first/S", "norm_seallm-prefill_first_over_seallm", ".2f"),
                ("p99 vLLM/S", "p99_vllm_over_seallm", ".2f"),
                ("norm Alpa/S", "norm_alpaserve_over_seallm", ".2f"),
                ("norm Mux/S", "norm_muxserve_over_seallm", ".2f"),
                ("SLO S/vLLM", "slo_seallm_over_vllm", ".2f"),
                ("vLLM drain s", "vllm_drain_s", ".0f"),
                ("SeaLLM drain s", "seallm_drain_s", ".0f"),
            ],
        )
    )
    if res.get("run_length"):
        extra += ["", "Run length (same processes, longer arrivals):", ""]
        extra.append(
            C.md_table(
                res["run_length"],
                [
                    ("arrivals s", "horizon_s", ".0f"),
                    ("req/s", "rate_rps", ".0f"),
                    ("vLLM norm", "vllm_norm_latency_mean", ".2f"),
                    ("SeaLLM norm", "seallm_norm_latency_mean", ".2f"),
                    ("norm ratio", "norm_ratio", ".2f"),
                    ("p99 ratio", "p99_ratio", ".2f"),
                    ("vLLM drain s", "vllm_drain_s", ".0f"),
                ],
            )
        )
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    return [
        C.plot_sweep(
            [
                r
                for r in res["rows"]
                if r["lengths"] == S.LENGTHS[0] and r["assignment"] == res["rows"][0]["assignment"]
            ],
            [
                ("norm_latency_mean", "normalized latency (mean)", True),
                ("latency_p99_s", "p99 latency (s)", True),
                ("slo_seallm", "SLO attainment (5× exec)", False),
            ],
            out / "seallm_sweep.png",
            TITLE,
        )
    ]
