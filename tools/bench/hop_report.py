"""Markdown table and plot of ``hop_bench.py``'s result (kept apart from the measuring code)."""

from __future__ import annotations

from pathlib import Path

GOAL_P50_MS = 1.0
GOAL_P99_MS = 3.0
GOAL_HTTP_P50_MS = 2.0  # added TTFT through the OpenAI API over a direct engine call
PATHS = ("direct", "through")  # the paths of every result (older results have only these)
ALL_PATHS = ("direct", "through", "http", "openai")
API_PATHS = {"http": "HTTP API (aiohttp)", "openai": "HTTP API (openai client)"}


def _paths(result: dict) -> list[str]:
    return list(result.get("paths", PATHS))


def hop_key(path: str) -> str:
    """The JSON key of ``path``'s added TTFT over direct: ``hop`` for through (as before), else hop_<path>."""
    return "hop" if path == "through" else f"hop_{path}"


def _cell(x: dict) -> str:
    return f"{x['median']:.2f} ({x['min']:.2f}–{x['max']:.2f})"


def _scenario(s: dict) -> str:
    return f"{s['mode']} ×{s['concurrency']}, {s['tokens']} tok"


def markdown(result: dict) -> str:
    lines = [
        "# Control-plane hop benchmark",
        "",
        f"{result['machine']} · {result['cpus']} CPUs · Python {result['python']} · "
        f"{result['repeats']} repeats · journal prefilled with {result['prefill']} requests · "
        f"engine threads {result['engine_threads']} · "
        f"scheduler flags `{' '.join(result['scheduler_args']) or '(defaults)'}` · wall {result['wall_s']:.0f} s",
        "",
        *_sdk_tables(result),
        *_api_table(result),
        *_cpu_table(result),
        "",
        f"Load average before / after the run: {result['load_before']} / {result['load_after']}",
        "",
    ]
    return "\n".join(lines)


def _sdk_tables(result: dict) -> list[str]:
    """Direct vs through the SDK per scenario, and the goals."""
    lines = [
        "Client-side TTFT in ms (call started -> first chunk with tokens): **direct** to the engine's "
        "`Generate` vs **through** the scheduler's `Submit` with the SDK, interleaved. Cells: median over "
        "repeats (min–max). Hop = through − direct per percentile.",
        "",
        "| scenario | n/repeat | direct p50 | through p50 | **hop p50** | direct p99 | through p99 | **hop p99** | hop p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["scenarios"]:
        lines.append(
            f"| {_scenario(s)} | {s['n_per_repeat']} | {_cell(s['direct']['p50'])} | {_cell(s['through']['p50'])} | "
            f"**{_cell(s['hop']['p50'])}** | {_cell(s['direct']['p99'])} | {_cell(s['through']['p99'])} | "
            f"**{_cell(s['hop']['p99'])}** | {_cell(s['hop']['p90'])} |"
        )
    lines += [
        "",
        f"Goal (issue item 7): hop ≤ {GOAL_P50_MS:g} ms p50 and ≤ {GOAL_P99_MS:g} ms p99.",
        "",
        "| scenario | hop p50 | goal met | hop p99 | goal met |",
        "|---|---:|---|---:|---|",
    ]
    for s in result["scenarios"]:
        p50, p99 = s["hop"]["p50"]["median"], s["hop"]["p99"]["median"]
        lines.append(
            f"| {_scenario(s)} | {p50:.2f} | {'yes' if p50 <= GOAL_P50_MS else 'no'} | {p99:.2f} | "
            f"{'yes' if p99 <= GOAL_P99_MS else 'no'} |"
        )
    return lines


def _api_table(result: dict) -> list[str]:
    """The HTTP API paths (aiohttp, openai) against direct, when measured."""
    api = [p for p in _paths(result) if p in API_PATHS]
    if not api:
        return []
    lines = [
        "",
        "Through the scheduler's OpenAI-compatible API (`POST /v1/completions`, `stream: true`): TTFT = "
        "request sent -> first `data:` event, over one persistent `aiohttp.ClientSession` (keep-alive "
        "connections, enough for a whole burst), interleaved with the paths above; `openai` is the "
        "same through the official `AsyncOpenAI` client. Hop = that path − direct per percentile. "
        f"Goal: HTTP hop ≤ {GOAL_HTTP_P50_MS:g} ms p50.",
        "",
        "| scenario | path | direct p50 | path p50 | **hop p50** | goal met | direct p99 | path p99 | **hop p99** | hop p90 |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for s in result["scenarios"]:
        for p in api:
            h = s[hop_key(p)]
            lines.append(
                f"| {_scenario(s)} | {API_PATHS[p]} | {_cell(s['direct']['p50'])} | {_cell(s[p]['p50'])} | "
                f"**{_cell(h['p50'])}** | {'yes' if h['p50']['median'] <= GOAL_HTTP_P50_MS else 'no'} | "
                f"{_cell(s['direct']['p99'])} | {_cell(s[p]['p99'])} | **{_cell(h['p99'])}** | "
                f"{_cell(h['p90'])} |"
            )
    return lines


def _cpu_table(result: dict) -> list[str]:
    """CPU time per request of every process, per scenario and path."""
    procs = sorted(
        {k for s in result["scenarios"] for p in _paths(result) for k in s["cpu_ms_per_request"][p]}
    )
    if not procs:
        return []
    lines = [
        "",
        "CPU time per request in ms (user + system, all repeats; `client` is this benchmark process):",
        "",
        "| scenario | path | " + " | ".join(procs) + " |",
        "|---|---|" + "---:|" * len(procs),
    ]
    for s in result["scenarios"]:
        for p in _paths(result):
            used = s["cpu_ms_per_request"][p]
            lines.append(
                f"| {_scenario(s)} | {p} | " + " | ".join(f"{used.get(k, 0.0):.2f}" for k in procs) + " |"
            )
    return lines


def plot(result: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = result["scenarios"]
    labels = [
        ("seq" if s["mode"] == "sequential" else f"×{s['concurrency']}") + f"\n{s['tokens']} tok"
        for s in scen
    ]
    paths = _paths(result)
    bars = [*paths, *(hop_key(p) for p in paths[1:])]  # direct, through, http, ..., hop, hop_http, ...
    width = 0.84 / len(bars)
    fig, axes = plt.subplots(1, 2, figsize=(4 + 2 * len(bars), 3.8))
    xs = range(len(scen))
    for ax, q, goal in ((axes[0], "p50", GOAL_P50_MS), (axes[1], "p99", GOAL_P99_MS)):
        for i, path in enumerate(bars):
            med = [s[path][q]["median"] for s in scen]
            err = [
                [m - s[path][q]["min"] for m, s in zip(med, scen, strict=True)],
                [s[path][q]["max"] - m for m, s in zip(med, scen, strict=True)],
            ]
            off = (i - (len(bars) - 1) / 2) * width
            ax.bar([x + off for x in xs], med, width, yerr=err, capsize=2, label=path)
        ax.axhline(goal, color="red", linestyle="--", linewidth=1, label=f"hop goal {goal:g} ms")
        if q == "p50" and any(p in API_PATHS for p in paths):
            ax.axhline(
                GOAL_HTTP_P50_MS,
                color="purple",
                linestyle=":",
                linewidth=1,
                label=f"HTTP hop goal {GOAL_HTTP_P50_MS:g} ms",
            )
        ax.set_xticks(list(xs), labels)
        ax.set_yscale("symlog", linthresh=1.0)  # sequential (~1 ms) and bursts (~100 ms) on one axis
        ax.set_ylabel("ms (linear below 1, log above)")
        ax.set_title(f"TTFT {q} (median of repeats, min–max)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "hop.png", dpi=120)
    plt.close(fig)
    return "hop.png"
