"""API keys file parsing, errors that name the entry, authentication and per-key services."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from llmfleet.security import (
    ApiKeyError,
    ApiKeyStore,
    KeyLimits,
    SecurityConfigError,
    SecuritySettings,
    bearer,
)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(text)
    return p


def test_keys_file_with_plain_and_hashed_keys_and_services(tmp_path):
    hashed = hashlib.sha256(b"sk-hashed-key-2").hexdigest()
    store = ApiKeyStore.load(
        write(
            tmp_path,
            f"""
keys:
  - {{name: team-a, key: sk-team-a-0001, services: [chat]}}
  - {{name: ops, sha256: {hashed}}}
""",
        )
    )
    a = store.authenticate("sk-team-a-0001")
    assert a is not None and a.name == "team-a" and a.allows("chat") and not a.allows("code")
    ops = store.authenticate("sk-hashed-key-2")
    assert ops is not None and ops.name == "ops" and ops.allows("anything")
    assert store.authenticate("sk-team-a-0002") is None
    assert store.authenticate("") is None and store.authenticate(None) is None
    assert store.visible(a, ["chat", "code"]) == ["chat"]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("keys: []", "keys"),
        ("keys:\n  - {name: a}", "keys.0: Value error, give exactly one of key or sha256"),
        ("keys:\n  - {name: a, key: short}", "keys.0.key"),
        ("keys:\n  - {name: a, sha256: nothex}", "keys.0.sha256"),
        ("keys:\n  - {name: a, key: sk-long-enough, colour: red}", "keys.0.colour"),
        (
            "keys:\n  - {name: a, key: sk-long-enough}\n  - {name: a, key: sk-other-key}",
            "duplicate key names",
        ),
        ("keys: [", "is not YAML"),
        (
            "keys:\n  - {name: a, key: sk-long-enough, limits: {requests_per_s: 0}}",
            "keys.0.limits.requests_per_s",
        ),
        (
            "keys:\n  - {name: a, key: sk-long-enough, limits: {requests_per_s: 1, burst: 0}}",
            "keys.0.limits.burst",
        ),
        (
            "keys:\n  - {name: a, key: sk-long-enough, limits: {tokens_per_min: -5}}",
            "keys.0.limits.tokens_per_min",
        ),
        ("keys:\n  - {name: a, key: sk-long-enough, limits: {rps: 5}}", "keys.0.limits.rps"),
        (
            "keys:\n  - {name: a, key: sk-long-enough, limits: {}}",
            "keys.0.limits: Value error, give requests_per_s",
        ),
        ("keys:\n  - {name: a, key: sk-long-enough, limits: {burst: 3}}", "burst needs requests_per_s"),
        ("keys:\n  - {name: a, key: sk-long-enough, max_priority: high}", "keys.0.max_priority"),
        ("keys:\n  - {name: a, key: sk-long-enough, max_priority: 1.5}", "keys.0.max_priority"),
        (
            "keys:\n  - {name: a, key: sk-long-enough}\n  - {name: b, key: sk-other-key, max_priority: 11}",
            "keys.1.max_priority: Input should be less than or equal to 10",
        ),
    ],
)
def test_bad_keys_files_name_the_entry(tmp_path, text, names):
    with pytest.raises(ApiKeyError) as e:
        ApiKeyStore.load(write(tmp_path, text))
    assert names in str(e.value)


def test_keys_with_rate_limits(tmp_path):
    store = ApiKeyStore.load(
        write(
            tmp_path,
            """
keys:
  - {name: team-a, key: sk-team-a-0001, limits: {requests_per_s: 20, burst: 40, tokens_per_min: 100000}}
  - {name: team-b, key: sk-team-b-0001, limits: {tokens_per_min: 5000}}
  - {name: ops, key: sk-ops-00001}
""",
        )
    )
    a, b, ops = (store.authenticate(k) for k in ("sk-team-a-0001", "sk-team-b-0001", "sk-ops-00001"))
    assert a.limits == KeyLimits(requests_per_s=20, burst=40, tokens_per_min=100_000)
    assert b.limits == KeyLimits(tokens_per_min=5000) and b.limits.requests_per_s is None
    assert ops.limits is None


def test_a_key_may_ask_up_to_its_max_priority(tmp_path):
    store = ApiKeyStore.load(
        write(
            tmp_path,
            "keys:\n  - {name: gold, key: sk-gold-00001, max_priority: 3}\n  - {name: b, key: sk-b-000001}",
        )
    )
    assert store.authenticate("sk-gold-00001").max_priority == 3
    assert store.authenticate("sk-b-000001").max_priority == 0  # the default


def test_missing_file_and_inline_keys(tmp_path):
    with pytest.raises(ApiKeyError, match="cannot read"):
        ApiKeyStore.load(tmp_path / "nope.yaml")
    store = ApiKeyStore.inline(" sk-one-11111 , sk-two-22222 ")
    assert store.authenticate("sk-two-22222").name == "key-2"
    with pytest.raises(ApiKeyError):
        ApiKeyStore.inline(" , ")


def test_bearer_parsing():
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer   abc ") == "abc"
    assert bearer("Basic abc") is None
    assert bearer("Bearer") is None
    assert bearer(None) is None


def test_settings_from_env_and_validation(tmp_path):
    s = SecuritySettings.from_env({"LLMFLEET_API_KEYS": "sk-env-key-1", "LLMFLEET_TLS_CA": "/x/ca.pem"})
    assert s.auth_enabled and s.client_tls and not s.server_tls
    assert s.key_store.authenticate("sk-env-key-1") is not None
    assert SecuritySettings.from_env({}, api_key="k").api_key == "k"
    with pytest.raises(SecurityConfigError, match="tls-cert and tls-key"):
        SecuritySettings(tls_cert="a.pem").validated()
    with pytest.raises(SecurityConfigError, match="tls-cert: cannot read"):
        SecuritySettings(tls_cert=str(tmp_path / "a.pem"), tls_key=str(tmp_path / "b.pem")).validated()
    with pytest.raises(SecurityConfigError, match="tls-client-auth"):
        SecuritySettings(tls_client_auth=True).validated()
    env = SecuritySettings(tls_ca="/ca.pem", tls_client_auth=True, api_key="k").to_env()
    assert env == {"LLMFLEET_TLS_CA": "/ca.pem", "LLMFLEET_TLS_CLIENT_AUTH": "1", "LLMFLEET_API_KEY": "k"}
    assert SecuritySettings.from_env(env).tls_client_auth
