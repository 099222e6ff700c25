"""Make a development CA and a certificate for TLS (``--tls-cert/--tls-key/--tls-ca``).

  llmfleet certs --out .llmfleet/tls --host 127.0.0.1 --host localhost --host scheduler

writes ``ca.pem`` + ``ca-key.pem`` (kept: later runs sign with the same CA), ``NAME.pem`` and
``NAME-key.pem``: one certificate valid as server and client (mutual TLS). For production, use your
organisation's CA."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmfleet.security.certs import write_dev_certs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=".llmfleet/tls", help="directory for the PEM files")
    p.add_argument("--host", action="append", default=None,
                   help="DNS name or IP the certificate is valid for (repeatable; default 127.0.0.1, localhost)")  # fmt: skip
    p.add_argument("--name", default="server", help="file name of the certificate (NAME.pem, NAME-key.pem)")
    p.add_argument("--days", type=int, default=365, help="validity in days")


def run(args: argparse.Namespace) -> int:
    if args.days <= 0:
        print(f"error: --days must be > 0, got {args.days}")
        return 1
    files = write_dev_certs(Path(args.out), args.host or ["127.0.0.1", "localhost"], args.days, args.name)
    print(f"ca:   {files.ca}\ncert: {files.cert}\nkey:  {files.key}")
    return 0
