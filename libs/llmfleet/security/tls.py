"""gRPC and HTTP TLS credentials from :class:`SecuritySettings`."""

from __future__ import annotations

import ssl
from typing import Any

import grpc

from llmfleet.security.settings import SecuritySettings


def server_credentials(s: SecuritySettings) -> grpc.ServerCredentials | None:
    """TLS for a gRPC server (None: plaintext); mutual TLS when ``tls_client_auth``."""
    if not s.server_tls:
        return None
    return grpc.ssl_server_credentials(
        [(s.read("tls_key"), s.read("tls_cert"))],
        root_certificates=s.read("tls_ca"),
        require_client_auth=s.tls_client_auth,
    )


def channel_credentials(s: SecuritySettings) -> grpc.ChannelCredentials | None:
    """TLS for an outgoing channel (None: plaintext). A process with a certificate presents it, so the
    same files serve mutual TLS; without ``tls_ca`` the system's roots verify the server."""
    if not s.client_tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=s.read("tls_ca"),
        private_key=s.read("tls_key"),
        certificate_chain=s.read("tls_cert"),
    )


def uvicorn_ssl(s: SecuritySettings) -> dict[str, Any]:
    """uvicorn.Config keyword arguments serving HTTPS (empty: plain HTTP). HTTP clients authenticate
    with API keys; a client certificate is asked for only with ``tls_client_auth``."""
    if not s.server_tls:
        return {}
    out: dict[str, Any] = {"ssl_certfile": s.tls_cert, "ssl_keyfile": s.tls_key}
    if s.tls_ca:
        out["ssl_ca_certs"] = s.tls_ca
    if s.tls_client_auth:
        out["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return out
