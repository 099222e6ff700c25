"""Command-line flags every service shares (``llmfleet-<service> --help``)."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from llmfleet.config import EtcdSettings
from llmfleet.metrics.server import add_metrics_arg
from llmfleet.security import add_security_args


def add_common_args(ap: argparse.ArgumentParser, role: str, default_port: int) -> None:
    ap.add_argument("--id", default=None, help=f"node id (default: {role}-<hostname>-<pid>)")
    ap.add_argument("--host", default=os.environ.get("LLMFLEET_HOST", "127.0.0.1"), help="bind address")
    ap.add_argument("--port", type=int, default=default_port, help="gRPC port (0 = any free port)")
    ap.add_argument("--advertise", default=None, help="address others use to reach this node (host:port)")
    ap.add_argument("--etcd", default=None, help="etcd endpoints host:port[,host:port] (env LLMFLEET_ETCD)")
    ap.add_argument("--prefix", default=None, help="etcd key prefix (env LLMFLEET_PREFIX, default /llmfleet)")
    ap.add_argument(
        "--ttl", type=int, default=None, help="lease TTL seconds (env LLMFLEET_LEASE_TTL, default 10)"
    )
    ap.add_argument("--log-level", default=os.environ.get("LLMFLEET_LOG_LEVEL", "INFO"))
    add_metrics_arg(ap)
    add_etcd_security_args(ap)
    add_security_args(ap)


def add_etcd_security_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("etcd client security")
    g.add_argument(
        "--etcd-ca", default=None, help="CA that verifies etcd's certificate: https (env LLMFLEET_ETCD_CA)"
    )
    g.add_argument("--etcd-cert", default=None, help="client certificate for etcd (env LLMFLEET_ETCD_CERT)")
    g.add_argument("--etcd-key", default=None, help="its private key (env LLMFLEET_ETCD_KEY)")
    g.add_argument("--etcd-user", default=None, help="etcd user (env LLMFLEET_ETCD_USER; the password from "
                   "env LLMFLEET_ETCD_PASSWORD or the file in LLMFLEET_ETCD_PASSWORD_FILE)")  # fmt: skip


def etcd_settings(args: argparse.Namespace) -> EtcdSettings:
    return EtcdSettings.from_env(
        endpoints=args.etcd,
        prefix=args.prefix,
        ttl=args.ttl,
        ca_cert=getattr(args, "etcd_ca", None),
        cert=getattr(args, "etcd_cert", None),
        key=getattr(args, "etcd_key", None),
        username=getattr(args, "etcd_user", None),
    )


def node_id(args: argparse.Namespace, role: str) -> str:
    return args.id or f"{role}-{socket.gethostname()}-{os.getpid()}"


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s {name} %(name)s: %(message)s",
    )
    for noisy in ("aetcd", "grpc", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _number(text: str, cast: type, low: float, strict: bool) -> float:
    """argparse type body: ``text`` as ``cast``, finite and above ``low`` (``strict``) or at least it."""
    try:
        v = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if cast is int else 'a number'}, got {text!r}"
        ) from None
    if not (v > low if strict else v >= low) or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag in the error)."""
    return int(_number(text, int, 1, strict=False))


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _number(text, float, 0, strict=True)


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _number(text, float, 0, strict=False)
