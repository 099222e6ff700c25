"""Test helper: a tiny child process serving grpc.health.v1 on --port (run as a script).

Accepts (and ignores) the llmfleet service flags so ``llmfleet up`` can launch it in place of a real
service. ``--exit-early CODE`` prints a message and exits before serving; ``--delay S`` waits before
serving; ``--ignore-term`` ignores SIGTERM; ``--term-log FILE`` appends ``--name`` there on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--id", dest="name", default="child")
    ap.add_argument("--exit-early", type=int, default=None)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--term-log", default=None)
    args, _ = ap.parse_known_args()

    print(f"{args.name}: starting on {args.host}:{args.port}", flush=True)
    if args.exit_early is not None:
        print(f"{args.name}: boom: refusing to start (exit {args.exit_early})", flush=True)
        return args.exit_early
    stop = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        if args.term_log:
            with open(args.term_log, "a") as f:
                f.write(f"{args.name}\n")
        if not args.ignore_term:
            stop.set()

    signal.signal(signal.SIGTERM, on_term)
    if stop.wait(args.delay):
        print(f"{args.name}: stopped before serving", flush=True)
        return 0
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    # a scheduler's readiness (llmfleet up waits for it): every stand-in says it is servable
    servicer.set("llmfleet.v1.Scheduler", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    print(f"{args.name}: serving", flush=True)
    while not stop.wait(0.1):
        pass
    server.stop(0)
    print(f"{args.name}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
