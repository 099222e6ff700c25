"""The checks of deploy/image/compose-smoke.sh, run with the host venv against the compose stack's
published ports. Each step prints one line; any failure raises (exit 1) with the reason.

    .venv/bin/python deploy/image/smoke_checks.py wait|requests|metrics [--timeout-s N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

GRPC = f"127.0.0.1:{os.environ.get('LLMFLEET_GRPC_PORT', '50051')}"
HTTP = f"http://127.0.0.1:{os.environ.get('LLMFLEET_HTTP_PORT', '8000')}/v1"
METRICS = {
    "scheduler": f"http://127.0.0.1:{os.environ.get('LLMFLEET_SCHEDULER_METRICS_PORT', '51051')}/metrics",
    "engine-0": f"http://127.0.0.1:{os.environ.get('LLMFLEET_ENGINE0_METRICS_PORT', '51061')}/metrics",
    "engine-1": f"http://127.0.0.1:{os.environ.get('LLMFLEET_ENGINE1_METRICS_PORT', '51062')}/metrics",
}
PROM = f"http://127.0.0.1:{os.environ.get('LLMFLEET_PROMETHEUS_PORT', '9090')}"
PROJECT = os.environ.get("SMOKE_PROJECT", "llmfleet-smoke")
# The services of deploy/compose/cluster.yaml: the OpenAI request goes to the first, the SDK's to the second.
SERVICES = ("chat", "summarize")
EXPECTED_TARGETS = 8  # 4 control-plane services + 2 engines + the OTLP receiver + Prometheus itself


class SmokeError(Exception):
    pass


def say(msg: str) -> None:
    print(f"  {msg}", flush=True)


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {sample name: sum over label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^\s{]+)(\{.*\})?\s+(\S+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def wait(timeout_s: float) -> None:
    """Until the scheduler answers gRPC and routes every service of the config to a loaded engine."""
    from llmfleet.client import Client, LlmfleetError

    deadline = time.monotonic() + timeout_s
    start, last = time.monotonic(), ""
    while True:
        try:
            with Client(GRPC) as client:
                services = {s.name: s for s in client.list_services(timeout_s=5)}
            routed = {n: list(services[n].engines) for n in SERVICES if n in services and services[n].engines}
            state = f"routed {routed}"
            if len(routed) == len(SERVICES):
                say(
                    f"healthy after {time.monotonic() - start:.0f}s: {', '.join(f'{k} -> {v}' for k, v in routed.items())}"
                )
                return
        except (LlmfleetError, OSError) as e:
            state = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        if state != last:
            say(f"waiting ({time.monotonic() - start:.0f}s): {state}")
            last = state
        if time.monotonic() > deadline:
            raise SmokeError(f"not healthy after {timeout_s:.0f}s: {state}")
        time.sleep(1)


def requests() -> None:
    """ONE OpenAI completion (HTTP API) and ONE SDK completion (gRPC Submit)."""
    from llmfleet.client import Client
    from openai import OpenAI

    oai = OpenAI(base_url=HTTP, api_key="unused", timeout=60, max_retries=0)
    t = time.monotonic()
    r = oai.completions.create(model=SERVICES[0], prompt="Once upon a time", max_tokens=8)
    dt = time.monotonic() - t
    if not r.choices or r.usage is None or r.usage.completion_tokens < 1:
        raise SmokeError(f"OpenAI completion returned no tokens: {r}")
    say(
        f"OpenAI  POST {HTTP}/completions model={SERVICES[0]}: {r.usage.completion_tokens} tokens, "
        f"finish={r.choices[0].finish_reason}, {dt * 1000:.0f} ms, text={r.choices[0].text!r}"
    )

    with Client(GRPC) as client:
        t = time.monotonic()
        c = client.complete("The quick brown fox", service=SERVICES[1], max_tokens=8, timeout_s=60)
        dt = time.monotonic() - t
    if c.usage.completion_tokens < 1:
        raise SmokeError(f"SDK completion returned no tokens: {c}")
    say(
        f"SDK     Client({GRPC}).complete service={SERVICES[1]}: {c.usage.completion_tokens} tokens on "
        f"{c.usage.engine_id}, finish={c.usage.finish_reason}, ttft {c.usage.ttft_s * 1000:.0f} ms, "
        f"{dt * 1000:.0f} ms, text={c.text!r}"
    )


def metrics(timeout_s: float) -> None:
    """/metrics of the scheduler and both engines count the two requests; Prometheus scrapes every
    target; the OTLP receiver got spans."""
    sched = parse_metrics(http_get(METRICS["scheduler"]))
    names = sorted(n for n in sched if n.startswith("llmfleet_"))
    done = sched.get("llmfleet_scheduler_requests_total", 0)
    if done < 2:
        raise SmokeError(f"scheduler llmfleet_scheduler_requests_total={done}, expected >= 2 ({names})")
    say(f"scheduler /metrics: {len(names)} llmfleet_ samples, llmfleet_scheduler_requests_total={done:g}")
    success = 0.0
    for engine in ("engine-0", "engine-1"):
        m = parse_metrics(http_get(METRICS[engine]))
        vllm = sorted(n for n in m if n.startswith("vllm:"))
        ours = sorted(n for n in m if n.startswith("llmfleet_"))
        if not vllm or not ours:
            raise SmokeError(
                f"{engine} /metrics lacks vllm: or llmfleet_ names: vllm {vllm}, llmfleet {ours}"
            )
        success += m.get("vllm:request_success_total", 0)
        say(
            f"{engine} /metrics: {len(vllm)} vllm: samples, {len(ours)} llmfleet_ samples, "
            f"vllm:request_success_total={m.get('vllm:request_success_total', 0):g}, "
            f"vllm:generation_tokens_total={m.get('vllm:generation_tokens_total', 0):g}"
        )
    if success < 2:
        raise SmokeError(f"the engines count {success:g} successful requests, expected >= 2")

    deadline = time.monotonic() + timeout_s
    while True:  # Prometheus: every target up, and it has scraped the engines' request counts
        targets = json.loads(http_get(f"{PROM}/api/v1/targets"))["data"]["activeTargets"]
        up = sorted(t["labels"]["instance"] for t in targets if t["health"] == "up")
        down = sorted(
            f"{t['labels']['instance']} ({t['health']}: {t.get('lastError')})"
            for t in targets
            if t["health"] != "up"
        )
        q = json.loads(
            http_get(f"{PROM}/api/v1/query?query=" + urllib.parse.quote("sum(vllm:request_success_total)"))
        )
        res = q["data"]["result"]
        scraped = float(res[0]["value"][1]) if res else 0.0
        if len(up) >= EXPECTED_TARGETS and not down and scraped >= 2:
            break
        if time.monotonic() > deadline:
            raise SmokeError(
                f"Prometheus: up {up}, not up {down}, sum(vllm:request_success_total)={scraped:g}"
            )
        time.sleep(2)
    say(f"Prometheus: {len(up)}/{len(targets)} targets up, sum(vllm:request_success_total)={scraped:g}")

    while True:  # spans: the services export in batches (every few seconds)
        text = subprocess.run(
            [
                "podman",
                "exec",
                f"{PROJECT}_otel-collector_1",
                "python",
                "-c",
                "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode())",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        spans = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r'^otlp_receiver_spans_total\{service="([^"]+)"\} (\S+)', text, re.M)
        }
        if spans.get("llmfleet-scheduler", 0) > 0 and spans.get("llmfleet-engine", 0) > 0:
            break
        if time.monotonic() > deadline:
            raise SmokeError(f"OTLP receiver: no scheduler and engine spans yet: {spans}")
        time.sleep(2)
    say(
        f"OTLP receiver (stand-in): {sum(spans.values()):g} spans: "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(spans.items()))
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["wait", "requests", "metrics"])
    ap.add_argument("--timeout-s", type=float, default=180)
    args = ap.parse_args()
    try:
        if args.step == "wait":
            wait(args.timeout_s)
        elif args.step == "requests":
            requests()
        else:
            metrics(args.timeout_s)
    except Exception as e:
        print(f"  FAILED ({args.step}): {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
