"""The soak report: TTFT and latency percentiles per path, and ``soak.md`` (errors, percentiles,
resident memory per process from the start through warm-up to the end)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tools.toolkit.stats import ms, pct

GROWTH_GOAL = 0.10


def stats(outcomes: Sequence[Any]) -> dict[str, Any]:
    """Requests, completed ones, and p50 / p99 TTFT and latency (ms) of the completed ones."""
    ok = [o for o in outcomes if o.status == "ok"]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    lat = [o.ended - o.started for o in ok]
    server = [o.server_ttft_s for o in ok if o.server_ttft_s is not None]
    return {
        "server_ttft_p50_ms": ms(pct(server, 50)),  # SDK only: the scheduler's usage.ttft_s
        "server_queue_p50_ms": ms(pct([o.server_queue_s for o in ok if o.server_queue_s is not None], 50)),
        "requests": len(outcomes),
        "ok": len(ok),
        "ttft_p50_ms": ms(pct(ttft, 50)),
        "ttft_p99_ms": ms(pct(ttft, 99)),
        "latency_p50_ms": ms(pct(lat, 50)),
        "latency_p99_ms": ms(pct(lat, 99)),
    }


def markdown(r: dict[str, Any]) -> str:
    """``soak.md``: the run, its errors, the percentiles per path and the memory table."""
    cfg, c = r["config"], r["counts"]
    errors = c["error"] + c["lost"] + c["duplicated"] + c["gapped"] + c["wrong"]
    lines = [
        "# Soak run",
        "",
        f"{cfg['requests']} requests, {cfg['concurrency']} concurrent streams (half SDK with both scheduler "
        f"replicas, half HTTP `/v1/completions` streaming, alternating replicas), greedy, max_tokens in "
        f"{cfg['lengths']}, {len(cfg['engines'])} CPU engines, {cfg['cpus']} CPUs: {r['elapsed_s']} s, "
        f"{r['throughput_rps']} req/s.",
        "",
        f"Errors: **{errors}** (client errors {c['error']}, lost {c['lost']}, duplicated {c['duplicated']}, "
        f"gapped {c['gapped']}, wrong {c['wrong']}); retries {c['retries']} "
        f"({c['retried_requests']} requests; SDK {c['sdk']['retries']}, HTTP {c['http']['retries']}).",
        "",
        "| path | requests | ok | TTFT p50 | TTFT p99 | latency p50 | latency p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("sdk", "http", "all", "after_warmup"):
        s = r[name]
        lines.append(
            f"| {name} | {s['requests']} | {s['ok']} | {s['ttft_p50_ms']} ms | {s['ttft_p99_ms']} ms | "
            f"{s['latency_p50_ms']} ms | {s['latency_p99_ms']} ms |"
        )
    rss = r["rss_kib"]
    lines += [
        "",
        f"Resident memory (MiB; warm-up = the first {cfg['warmup']} requests, {r['warmup_s']} s):",
        "",
        "| process | start | after warm-up | end | end vs warm-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in sorted(rss["end"], key=lambda n: (n == "load-generator", n)):
        g = r["rss_growth_after_warmup"].get(name)
        flag = "" if g is None or abs(g) <= GROWTH_GOAL else " **over 10%**"
        lines.append(
            f"| {name} | {_mib(rss['start'].get(name))} | {_mib(rss['after_warmup'].get(name))} | "
            f"{_mib(rss['end'].get(name))} | {'-' if g is None else f'{100 * g:+.1f}%'}{flag} |"
        )
    if c["examples"]:
        lines += ["", "Examples of failures: " + "; ".join(c["examples"])]
    return "\n".join(lines) + "\n"


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f}"
