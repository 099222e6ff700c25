"""tools.bench.prefix_bench_metrics.Sampler: it reads the engines' counters until the first prompt token,
then only at the window's edges and at exit, and gives the window's output tokens/s."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.bench.prefix_bench_metrics import Sampler, scrape_sums

LOAD_AT_S = 0.2  # the first prompt token, after the sampler starts
TOKENS_PER_S = 1000.0


class Engine:
    """A /metrics page whose counters grow as a loaded engine's: prompt tokens from ``LOAD_AT_S``,
    output tokens at ``TOKENS_PER_S`` from then on; counts its scrapes."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.scrapes = 0

    def page(self) -> bytes:
        self.scrapes += 1
        t = time.monotonic() - self.t0 - LOAD_AT_S
        prompt, generated = (100.0, TOKENS_PER_S * t) if t > 0 else (0.0, 0.0)
        return (
            f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}\n'
            f'vllm:generation_tokens_total{{model_name="m"}} {generated}\n'
            f"vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\n"
        ).encode()


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    e = Engine()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = e.page()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield e, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_after_the_start_only_the_window_edges_and_the_exit_are_scraped(engine: tuple[Engine, str]) -> None:
    e, address = engine
    with Sampler([address], window=(0.3, 0.6), period_s=0.05) as sampler:
        while sampler.start() is None:
            time.sleep(0.01)
        before, taken = e.scrapes, len(sampler.samples)
        deadline = time.monotonic() + 30
        while len(sampler.samples) < taken + 2 and time.monotonic() < deadline:  # both edges read
            time.sleep(0.01)
        time.sleep(0.3)  # six polling periods: a sampler still polling would read again
    assert e.scrapes - before == 3  # the two edges, then the exit
    rate = sampler.window_tokens_per_s()
    assert rate is not None and rate == pytest.approx(TOKENS_PER_S, rel=0.05)
    assert sampler.last()["prompt_tokens"] == 100.0


def test_a_run_that_ends_inside_the_window_has_no_window_rate(engine: tuple[Engine, str]) -> None:
    _, address = engine
    with Sampler([address], window=(0.3, 5.0), period_s=0.05) as sampler:
        while sampler.start() is None:
            time.sleep(0.01)
        time.sleep(0.4)
    assert sampler.window_tokens_per_s() is None
    assert Sampler([address]).window_tokens_per_s() is None  # no window asked


def test_one_read_of_each_page_sums_every_pattern(engine: tuple[Engine, str]) -> None:
    e, address = engine
    e.t0 -= 10  # loaded: 100 prompt tokens on each page
    hits = re.compile(r"^vllm:(prefix_cache_hits)_total (\S+)$")
    totals = scrape_sums([address, address], {"prompt_tokens": 0.0, "prefix_cache_hits": 5.0}, PROMPTS, hits)
    assert e.scrapes == 2 and totals == {"prompt_tokens": 200.0, "prefix_cache_hits": 5.0}
    assert scrape_sums(["127.0.0.1:1"], {"prompt_tokens": 1.0}, PROMPTS) == {
        "prompt_tokens": 1.0
    }  # unreachable


PROMPTS = re.compile(r'^vllm:(prompt_tokens)_total\{model_name="m"\} (\S+)$')
