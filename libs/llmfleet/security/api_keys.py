"""API keys: who may call, and which services each key may use.

A keys file (YAML)::

    keys:
      - name: team-a               # shown in logs and errors, never the key itself
        key: sk-team-a-0123...     # the key, or instead
        # sha256: 9f86d08...       # its SHA-256 hex digest, so the file holds no secret
        services: [chat]           # optional: the services this key may use (default: all)
        limits:                    # optional: per-key rate limits (see llmfleet.security.rate_limits)
          requests_per_s: 20       #   requests a second, with bursts of
          burst: 40                #   up to this many at once (default: one second's worth)
          tokens_per_min: 100000   #   estimated tokens a minute (the scheduler: prompt + max_tokens)
        max_priority: 2            # optional: the highest request priority it may ask for (default 0;
                                   #   a request may always ask for its service's own priority)

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest` against every entry (no early
exit), so the time taken does not depend on how much of a key matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmfleet.policies.capacity.priority import DEFAULT_KEY_MAX_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from llmfleet.security.rate_limits import KeyLimits


class ApiKeyError(ValueError):
    """The keys file is unusable; the message names the entry and the field."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class _Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests_per_s: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)
    tokens_per_min: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_limit(self) -> _Limits:
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst needs requests_per_s")
        if self.requests_per_s is None and self.tokens_per_min is None:
            raise ValueError("give requests_per_s or tokens_per_min (or leave limits out)")
        return self


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    key: str | None = Field(None, min_length=8)
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    services: list[str] | None = None
    limits: _Limits | None = None
    max_priority: int = Field(DEFAULT_KEY_MAX_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)

    @model_validator(mode="after")
    def _one_secret(self) -> _KeyEntry:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of key or sha256")
        return self


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[_KeyEntry] = Field(min_length=1)


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes
    services: frozenset[str] | None = None  # None: every service
    limits: KeyLimits | None = None  # None: no rate limits
    max_priority: int = DEFAULT_KEY_MAX_PRIORITY  # the highest request priority it may ask for

    def allows(self, service: str) -> bool:
        return self.services is None or service in self.services


@dataclass(frozen=True)
class ApiKeyStore:
    keys: tuple[ApiKey, ...]

    def authenticate(self, token: str | None) -> ApiKey | None:
        """The key ``token`` is, or None; constant time in the token's content."""
        if not token:
            return None
        d = digest(token)
        found = None
        for k in self.keys:
            if hmac.compare_digest(d, k.digest) and found is None:
                found = k
        return found

    def visible(self, key: ApiKey | None, services: Sequence[str]) -> list[str]:
        return [s for s in services if key is None or key.allows(s)]

    @classmethod
    def inline(cls, text: str) -> ApiKeyStore:
        """``key1,key2``: keys for every service (named key-1, key-2 ...)."""
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if not keys:
            raise ApiKeyError("LLMFLEET_API_KEYS: no keys given")
        return cls(tuple(ApiKey(f"key-{i + 1}", digest(k)) for i, k in enumerate(keys)))

    @classmethod
    def load(cls, path: Path) -> ApiKeyStore:
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ApiKeyError(f"api-keys: cannot read {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ApiKeyError(f"api-keys: {path} is not YAML: {e}") from None
        try:
            parsed = _KeysFile.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ApiKeyError(f"api-keys {path}: {where}: {err['msg']}") from None
        names = [k.name for k in parsed.keys]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ApiKeyError(f"api-keys {path}: duplicate key names {dup}")
        return cls(
            tuple(
                ApiKey(
                    e.name,
                    digest(e.key) if e.key is not None else bytes.fromhex(e.sha256 or ""),
                    frozenset(e.services) if e.services is not None else None,
                    KeyLimits(**e.limits.model_dump()) if e.limits is not None else None,
                    e.max_priority,
                )
                for e in parsed.keys
            )
        )


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (None when absent or another scheme)."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
