"""The chaos report: the issue's goals checked against a run's report, and its markdown table."""

from __future__ import annotations

from typing import Any


def goals(report: dict[str, Any]) -> dict[str, bool]:
    """The issue's goals, checked against a report."""
    ttl = report["config"]["ttl_s"]
    tot = report["total"]
    return {
        "0 lost": tot["lost"] == 0,
        "0 duplicated/gapped/wrong": tot["duplicated"] + tot["gapped"] + tot["wrong"] == 0,
        "0 client errors": tot["error"] == 0,
        "whole within one TTL of the heal": all(
            f["whole_after_heal_s"] is not None and f["whole_after_heal_s"] <= ttl for f in report["faults"]
        ),
        "whole within one TTL of the restarted process's start-up": all(
            f["whole_after_heal_s"] is not None and f["whole_after_heal_s"] - f["startup_s"] <= ttl
            for f in report["faults"]
        ),
    }


def markdown(report: dict[str, Any]) -> str:
    """``chaos.md``: one row per phase (baseline, each fault, the total), the goals, the notes."""
    cfg = report["config"]
    lines = [
        "# Chaos run",
        "",
        f"{cfg['concurrency']} concurrent streams ({cfg['sdk_workers']} SDK with both replicas, "
        f"{cfg['http_workers']} HTTP `/v1/completions` alternating replicas), greedy, max_tokens in "
        f"{cfg['lengths']}, lease TTL {cfg['ttl_s']} s, engines {', '.join(cfg['engines'])}; "
        f"{cfg['cpus']} CPUs; {report['duration_s']} s of load. SDK retries: {cfg['sdk_retries']}; "
        f"HTTP retries: {cfg['http_retries']}. Requests count in the phase they started in.",
        "",
        "| fault | target | in flight | started | completed | lost | dup/gap/wrong | errors (sdk/http) "
        "| retries (sdk/http) | whole after inject | after heal | of which start-up | max stall |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    b = report["baseline"]
    lines.append(
        f"| (baseline) | - | - | {b['started']} | {b['completed']} | {b['lost']} | "
        f"{b['duplicated'] + b['gapped'] + b['wrong']} | {b['sdk']['errors']}/{b['http']['errors']} | "
        f"{b['sdk']['retries']}/{b['http']['retries']} | - | - | - | {b['max_stall_s']} s |"
    )
    for f in report["faults"]:
        c = f["counts"]
        whole = "never" if f["whole_after_inject_s"] is None else f"{f['whole_after_inject_s']} s"
        heal = "never" if f["whole_after_heal_s"] is None else f"{f['whole_after_heal_s']} s"
        lines.append(
            f"| {f['fault']} | {f['target']} | {f['in_flight_at_inject']} | {c['started']} | {c['completed']} "
            f"| {c['lost']} | {c['duplicated'] + c['gapped'] + c['wrong']} | "
            f"{c['sdk']['errors']}/{c['http']['errors']} | {c['sdk']['retries']}/{c['http']['retries']} "
            f"| {whole} | {heal} | {f['startup_s']} s | {f['max_stall_s']} s |"
        )
    t = report["total"]
    lines += [
        f"| **total** | | | {t['started']} | {t['completed']} | {t['lost']} | "
        f"{t['duplicated'] + t['gapped'] + t['wrong']} | {t['sdk']['errors']}/{t['http']['errors']} | "
        f"{t['sdk']['retries']}/{t['http']['retries']} | | | | |",
        "",
        "Goals: " + ", ".join(f"{k}: {'met' if v else '**missed**'}" for k, v in goals(report).items()),
        "",
        f"'{cfg['engine_freeze_note']}'. 'whole': every process registered with a live lease, both "
        "leaders elected, both schedulers route the service to every engine and answer HTTP /health. "
        "'max stall': the longest time no token reached any client between the inject and the end of "
        "the settle.",
        "",
    ]
    for f in report["faults"]:
        if f["counts"]["examples"] or f["not_whole_reason"]:
            lines.append(f"- {f['fault']}: {'; '.join(f['counts']['examples'])} {f['not_whole_reason']}")
        if f.get("unexpected_exits"):
            lines.append(
                f"- {f['fault']}: exited on their own (restarted): {', '.join(f['unexpected_exits'])}"
            )
    lines += ["", "Retry reasons (count) per fault:", ""]
    for f in report["faults"]:
        reasons = f["counts"].get("retry_reasons") or {}
        if reasons:
            lines.append(f"- {f['fault']}: " + "; ".join(f"{k} ({v})" for k, v in reasons.items()))
    return "\n".join(lines) + "\n"
