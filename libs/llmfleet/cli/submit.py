"""``llmfleet submit "prompt" --service NAME``: stream a completion to stdout, usage to stderr.

Exit codes: 0 ok, 2 invalid argument / not found, 3 unavailable, 4 deadline exceeded, 1 other
errors, 130 interrupted (the request is cancelled on the scheduler).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import grpc
from rich.console import Console
from rich.markup import escape

from llmfleet.client import AsyncClient, LlmfleetError, Usage

EXIT_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: 2,
    grpc.StatusCode.OUT_OF_RANGE: 2,
    grpc.StatusCode.NOT_FOUND: 2,
    grpc.StatusCode.UNAVAILABLE: 3,
    grpc.StatusCode.DEADLINE_EXCEEDED: 4,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help='the prompt ("-" reads it from stdin)')
    p.add_argument("--service", "-s", required=True, help="service name (see `llmfleet status`)")
    p.add_argument(
        "--scheduler",
        default=os.environ.get("LLMFLEET_SCHEDULER", "127.0.0.1:50051,127.0.0.1:50056"),
        help="scheduler replicas host:port[,host:port] (env LLMFLEET_SCHEDULER; default: the two `llmfleet up` starts)",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="default: the service's default")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a random uuid)")
    p.add_argument(
        "--priority", type=int, default=None,
        help="the request's priority (default: the service's; higher first, negative: sheddable)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=None, help="deadline in seconds for the whole request")
    p.add_argument("--retries", type=int, default=3, help="retries when the scheduler is unavailable")


def format_usage(usage: Usage, request_id: str) -> str:
    return (
        f"request {request_id} finished ({usage.finish_reason}) on {usage.engine_id or '?'}: "
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens, "
        f"queue {usage.queue_s:.3f}s, ttft {usage.ttft_s:.3f}s, latency {usage.latency_s:.3f}s"
    )


async def _submit(args: argparse.Namespace, prompt: str, err: Console) -> int:
    async with AsyncClient(args.scheduler, retries=args.retries) as client:
        stream = client.generate(
            prompt,
            args.service,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
            request_id=args.request_id,
            priority=args.priority,
            timeout_s=args.timeout,
        )
        interrupted = _cancel_on_ctrl_c(client, stream.request_id)
        ended_with_newline = True
        try:
            async for chunk in stream:
                if chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    ended_with_newline = chunk.text.endswith("\n")
        finally:
            if not ended_with_newline:
                sys.stdout.write("\n")
                sys.stdout.flush()
        if interrupted.is_set():
            err.print(f"[yellow]interrupted; request {stream.request_id} cancelled[/]")
            return 130
        assert stream.usage is not None
        err.print(escape(format_usage(stream.usage, stream.request_id)), style="dim", highlight=False)
    return 0


def _cancel_on_ctrl_c(client: AsyncClient, request_id: str) -> asyncio.Event:
    """First Ctrl-C cancels the request on the scheduler (the stream then ends with "cancelled");
    a second one, or a failed cancel, stops waiting at once."""
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    async def cancel() -> None:
        try:
            await client.cancel(request_id, timeout_s=2.0)
        except LlmfleetError:
            main.cancel()

    def on_sigint() -> None:
        if interrupted.is_set():
            main.cancel()
            return
        interrupted.set()
        task = loop.create_task(cancel())
        _background.add(task)
        task.add_done_callback(_background.discard)

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    return interrupted


_background: set[asyncio.Task[None]] = set()


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, soft_wrap=True)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        return asyncio.run(_submit(args, prompt, err))
    except LlmfleetError as e:
        rid = f" (request {e.request_id})" if e.request_id else ""
        err.print(f"[red]error:[/] {e.code.name}: {escape(e.message)}{rid}", highlight=False)
        return EXIT_CODES.get(e.code, 1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err.print("[yellow]interrupted[/]")
        return 130
