"""The report of ``make bench-burst`` (``burst_bench``): the markdown table and notes, and one PNG per
burst scenario of the engines hosting ``chat`` over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown(report: dict) -> str:
    lines = [f"# bench-burst ({report['machine']['platform']})", ""]
    lines += [
        "| scenario | arm | requests | failed | p50 latency s | p99 latency s | tokens/s | max engine share |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for name in scenario_names(report):
        for arm, r in report[name].items():  # in run order: today, new, move_queued
            lines.append(
                f"| {name} | {arm} | {r['requests']} | {r['failed']} | {_f(r['latency_p50_s'])} | "
                f"{_f(r['latency_p99_s'])} | {_f(r.get('tokens_per_s'), '{:.0f}')} | "
                f"{_f(r.get('max_engine_share'), '{:.0%}')} |"
            )
    cold = report.get("cold", {}).get("new")
    if cold:
        lines += ["", f"Cold start (new): time to first token p50 {_f(cold['ttft_p50_s'])} s, max "
                  f"{_f(cold['ttft_max_s'])} s; an engine had the model loaded {_f(cold['model_loaded_after_s'])} s "
                  "after the requests were sent."]  # fmt: skip
    for name in [n for n in scenario_names(report) if n not in ("cold", "after_up")]:
        t = report.get(name, {}).get("today")
        for arm in ("new", "move_queued"):
            n = report.get(name, {}).get(arm)
            if t and n and t.get("tokens_per_s") and n.get("tokens_per_s"):
                lines += ["", f"{name}: {arm} vs today (early binding): throughput "
                          f"{n['tokens_per_s'] / t['tokens_per_s']:.2f}×, p99 {n['latency_p99_s'] / t['latency_p99_s']:.2f}×; "
                          f"per engine today {t['per_engine']}, {arm} {n['per_engine']}; scheduler CPU "
                          f"{_f(t.get('scheduler_cpu_s'), '{:.1f}')} s / {_f(n.get('scheduler_cpu_s'), '{:.1f}')} s over "
                          f"{_f(t.get('wall_s'), '{:.1f}')} s / {_f(n.get('wall_s'), '{:.1f}')} s"
                          + (f"; emulated steps late {_late(t)} / {_late(n)}" if "emulated_lag" in n else "") + "."]  # fmt: skip
    for name in [n for n in scenario_names(report) if n.startswith("emulated-")]:
        sim = report[name].get("new", {}).get("sim")
        if not sim:
            continue
        live = report[name]["new"]
        lines += ["", f"Simulator vs live ({name}, new): p50 latency {_f(sim['latency_p50_s'])} s vs "
                  f"{_f(live['latency_p50_s'])} s ({sim['latency_p50_s'] / live['latency_p50_s'] - 1:+.0%}); "
                  f"chat engines sim {sim['chat_engines_over_time']}, live (changes) "
                  f"{_changes(live['chat_engines_over_time'])}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _late(r: dict) -> str:
    lag = r.get("emulated_lag") or {}
    waits = lag.get("waits") or 0
    return f"{lag.get('late', 0) / waits:.0%} (lag {lag.get('lag_s', 0):.1f} s)" if waits else "—"


def scenario_names(report: dict) -> list[str]:
    """The scenarios a report holds, in run order."""
    return [k for k, v in report.items() if isinstance(v, dict) and ("today" in v or "new" in v)]


def _changes(series: list) -> list:
    out, last = [], None
    for t, n in series:
        if n != last:
            out.append((t, n))
            last = n
    return out


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in [n for n in scenario_names(report) if n not in ("cold", "after_up")]:
        arms = report[name]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for arm, r in arms.items():
            series = r.get("chat_engines_over_time") or []
            if series:
                ax.step([t for t, _ in series], [n for _, n in series], where="post", label=f"live {arm}")
        sim = arms.get("new", {}).get("sim")
        if sim:
            series = sim["chat_engines_over_time"]
            ax.step(
                [t for t, _ in series], [n for _, n in series], where="post", linestyle="--", label="sim new"
            )
        ax.set_xlabel("seconds after the burst")
        ax.set_ylabel("engines hosting chat")
        ax.set_title(f"{name}: {report['burst_size']} concurrent requests")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}_engines.png", dpi=120)
        plt.close(fig)
