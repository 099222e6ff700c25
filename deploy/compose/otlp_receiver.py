"""A minimal OTLP/gRPC receiver: the compose stack's STAND-IN for the OpenTelemetry Collector.

No collector image is reachable without a registry and there is no pip-installable collector, so this
accepts OTLP exports (traces, metrics, logs) on :4317 from every llmfleet process, counts spans per
``service.name``, logs a one-line summary every ``--log-every-s`` seconds and exposes the counts on
``/metrics`` (``otlp_receiver_spans_total{service=...}``, ``otlp_receiver_exports_total{signal=...}``)
so Prometheus and the smoke test can check that traces arrive. It stores nothing and forwards nothing.
With a registry, ``otel-collector.yaml`` + ``otel/opentelemetry-collector`` is the real thing.

    python deploy/compose/otlp_receiver.py --port 4317 --metrics-port 9464
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter
from concurrent import futures

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client import Counter as PromCounter
from prometheus_client import start_http_server

log = logging.getLogger("otlp_receiver")
SPANS = PromCounter("otlp_receiver_spans", "spans received over OTLP, by resource service.name", ["service"])
EXPORTS = PromCounter("otlp_receiver_exports", "OTLP export calls received, by signal", ["signal"])


def _service_name(resource) -> str:
    for attr in resource.attributes:
        if attr.key == "service.name":
            return attr.value.string_value or "?"
    return "?"


class Receiver(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: Counter[str] = Counter()

    def Export(self, request, context):
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            EXPORTS.labels("traces").inc()
            for rs in request.resource_spans:
                n = sum(len(ss.spans) for ss in rs.scope_spans)
                name = _service_name(rs.resource)
                SPANS.labels(name).inc(n)
                with self.lock:
                    self.spans[name] += n
            return trace_service_pb2.ExportTraceServiceResponse()
        if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
            EXPORTS.labels("metrics").inc()
            return metrics_service_pb2.ExportMetricsServiceResponse()
        EXPORTS.labels("logs").inc()
        return logs_service_pb2.ExportLogsServiceResponse()

    def summary(self) -> str:
        with self.lock:
            total = sum(self.spans.values())
            parts = ", ".join(f"{k} {v}" for k, v in sorted(self.spans.items()))
        return f"spans received: {total}" + (f" ({parts})" if parts else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=4317)
    ap.add_argument("--metrics-port", type=int, default=9464, help="Prometheus /metrics (-1: off)")
    ap.add_argument("--log-every-s", type=float, default=10.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s otlp-receiver: %(message)s")

    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(receiver, server)
    server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    if args.metrics_port >= 0:
        start_http_server(args.metrics_port, addr=args.host)
    log.info("OTLP/gRPC stand-in receiver on %s:%d, /metrics on :%d", args.host, args.port, args.metrics_port)
    last = ""
    try:
        while True:
            time.sleep(args.log_every_s)
            line = receiver.summary()
            if line != last:
                log.info("%s", line)
                last = line
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=1)


if __name__ == "__main__":
    main()
