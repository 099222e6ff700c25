"""``llmfleet up --tls`` / ``--api-keys``: the security settings every child gets in its environment,
with a development CA and certificate made once under ``STATE_DIR/tls``."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmfleet.security import SecuritySettings, configure
from llmfleet.security.certs import write_dev_certs


def security_env(args: argparse.Namespace, state: Path) -> dict[str, str]:
    """``--tls``: a development CA + certificate under ``state/tls`` (made once), given to every child
    (mutual TLS between services; the scheduler, the users' entry point, asks no client certificate)
    and used by ``up``'s own health checks. ``--api-keys`` is checked
    here so a bad file fails before anything starts."""

    if args.api_keys:
        SecuritySettings(api_keys_file=str(Path(args.api_keys).resolve())).validated()
    if not args.tls:
        return {}
    tls = state / "tls"
    if not (tls / "server.pem").exists():
        hosts = list(
            dict.fromkeys([args.host if args.host != "0.0.0.0" else "127.0.0.1", "127.0.0.1", "localhost"])
        )
        write_dev_certs(tls, hosts)
    settings = SecuritySettings(
        tls_cert=str(tls / "server.pem"),
        tls_key=str(tls / "server-key.pem"),
        tls_ca=str(tls / "ca.pem"),
        tls_client_auth=True,
    ).validated()
    configure(settings)
    env = settings.to_env()
    # for the CLI and SDK in another shell: `. .llmfleet/tls/env` (add LLMFLEET_API_KEY yourself)
    client = {k: v for k, v in env.items() if k != "LLMFLEET_TLS_CLIENT_AUTH"}
    (tls / "env").write_text("".join(f"export {k}={v}\n" for k, v in sorted(client.items())))
    return env


def child_env(base: dict[str, str], name: str) -> dict[str, str]:
    """The security environment of child ``name``: a scheduler and the OpenAI front (the users' entry
    points) serve TLS and API keys but ask no client certificate."""
    env = dict(base)
    if env and (name.startswith("scheduler") or name == "front"):
        env["LLMFLEET_TLS_CLIENT_AUTH"] = "0"
    return env
