"""Process-wide security settings: TLS files, the API keys a server accepts, the key a client sends.

Every process reads them once at start-up (flags of :func:`add_security_args`, else ``LLMFLEET_*``
environment variables, so compose files and systemd environment files configure them too) and calls
:func:`configure`; :class:`~llmfleet.rpc.GrpcServer`, :func:`~llmfleet.rpc.channels.open_channel`
and the HTTP API read :func:`current`. Nothing is enabled by default (a local ``make run``).

The model: API keys authenticate *users* where they come in (the scheduler's gRPC and HTTP API;
any server given ``--api-keys`` enforces them); TLS encrypts every hop, and ``--tls-client-auth``
(mutual TLS) authenticates the *services* to each other by certificate.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from llmfleet.security.api_keys import ApiKeyStore

ENV = {
    "tls_cert": "LLMFLEET_TLS_CERT",
    "tls_key": "LLMFLEET_TLS_KEY",
    "tls_ca": "LLMFLEET_TLS_CA",
    "tls_client_auth": "LLMFLEET_TLS_CLIENT_AUTH",
    "tls": "LLMFLEET_TLS",
    "api_keys_file": "LLMFLEET_API_KEYS_FILE",
    "api_keys": "LLMFLEET_API_KEYS",
    "api_key": "LLMFLEET_API_KEY",
}


class SecurityConfigError(ValueError):
    """A security setting is unusable (a missing file, a certificate without its key ...)."""


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class SecuritySettings:
    tls_cert: str | None = None  # this server's certificate chain (PEM): serve TLS
    tls_key: str | None = None  # its private key (PEM)
    tls_ca: str | None = None  # CA bundle that verifies the servers we call (and clients, with mTLS)
    tls_client_auth: bool = False  # servers require a client certificate signed by tls_ca (mutual TLS)
    api_keys_file: str | None = None  # keys this process accepts (YAML, see ApiKeyStore.load)
    api_keys: str | None = None  # or inline: "key1,key2" (every service)
    api_key: str | None = None  # the key this process (or SDK) sends on its own calls
    tls: bool = False  # outgoing channels use TLS even without tls_ca (verified by the system's roots)
    _checked: bool = field(default=False, repr=False, compare=False)

    # -- what is on ------------------------------------------------------------------------------------
    @property
    def server_tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def client_tls(self) -> bool:
        """Outgoing channels use TLS when a CA is given or this process serves TLS itself."""
        return bool(self.tls or self.tls_ca or self.tls_cert)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys_file or self.api_keys)

    @cached_property
    def key_store(self) -> ApiKeyStore | None:
        """The accepted keys (None: no authentication)."""
        if self.api_keys_file:
            return ApiKeyStore.load(Path(self.api_keys_file))
        if self.api_keys:
            return ApiKeyStore.inline(self.api_keys)
        return None

    def read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise SecurityConfigError(f"{name.replace('_', '-')}: cannot read {path}: {e.strerror}") from None

    def validated(self) -> SecuritySettings:
        """Check the files now (a misconfigured server must not start, least of all in plaintext)."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SecurityConfigError("tls-cert and tls-key: give both (a certificate and its private key)")
        if self.tls_client_auth and not (self.tls_ca and self.tls_cert):
            raise SecurityConfigError(
                "tls-client-auth: needs tls-ca (to verify clients) and tls-cert/tls-key"
            )
        for name in ("tls_cert", "tls_key", "tls_ca"):
            self.read(name)
        _ = self.key_store  # parses the keys file; raises naming the bad entry
        return self

    # -- construction ----------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> SecuritySettings:
        env = dict(os.environ if env is None else env)
        values: dict[str, object] = {k: env.get(v) or None for k, v in ENV.items()}
        values["tls_client_auth"] = _truthy(env.get(ENV["tls_client_auth"]))
        values["tls"] = _truthy(env.get(ENV["tls"]))
        values.update({k: v for k, v in overrides.items() if v is not None and v is not False})
        # values holds each field's own type (text or a flag), which one dict value type cannot say
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment that gives a child process these settings (``llmfleet up``)."""
        out = {}
        for k, var in ENV.items():
            v = getattr(self, k)
            if v:
                out[var] = "1" if v is True else str(v)
        return out


def add_security_args(ap: argparse.ArgumentParser, server: bool = True) -> None:
    g = ap.add_argument_group("security (flags override the LLMFLEET_* environment variables)")
    if server:
        g.add_argument(
            "--tls-cert",
            default=None,
            help="serve TLS with this certificate chain (PEM; env LLMFLEET_TLS_CERT)",
        )
        g.add_argument("--tls-key", default=None, help="its private key (PEM; env LLMFLEET_TLS_KEY)")
        g.add_argument("--tls-client-auth", action="store_true", default=False,
                       help="require client certificates signed by --tls-ca (mutual TLS; env LLMFLEET_TLS_CLIENT_AUTH=1)")  # fmt: skip
        g.add_argument("--api-keys", dest="api_keys_file", default=None,
                       help="accept only these API keys (YAML file; env LLMFLEET_API_KEYS_FILE, or inline LLMFLEET_API_KEYS=k1,k2)")  # fmt: skip
    g.add_argument(
        "--tls-ca", default=None, help="CA bundle that verifies the servers called (env LLMFLEET_TLS_CA)"
    )
    g.add_argument("--api-key", default=None, help="API key sent on outgoing calls (env LLMFLEET_API_KEY)")


def settings_from_args(args: argparse.Namespace) -> SecuritySettings:
    return SecuritySettings.from_env(
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
        tls_ca=getattr(args, "tls_ca", None),
        tls_client_auth=getattr(args, "tls_client_auth", False),
        api_keys_file=getattr(args, "api_keys_file", None),
        api_key=getattr(args, "api_key", None),
    ).validated()


_current: SecuritySettings | None = None


def configure(settings: SecuritySettings | None) -> SecuritySettings | None:
    """Set this process's settings (None: back to the environment's); returns the previous ones."""
    global _current
    previous, _current = _current, settings
    return previous


def current() -> SecuritySettings:
    """This process's settings: what :func:`configure` set, else the environment's."""
    global _current
    if _current is None:
        _current = SecuritySettings.from_env()
    return _current
