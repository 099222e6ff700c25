"""API keys, TLS and their process-wide settings (see :mod:`llmfleet.security.settings`)."""

from llmfleet.security.api_keys import ApiKey, ApiKeyError, ApiKeyStore, bearer
from llmfleet.security.rate_limits import KeyLimits, KeyRateLimiter, RateLimited
from llmfleet.security.settings import (
    SecurityConfigError,
    SecuritySettings,
    add_security_args,
    configure,
    current,
    settings_from_args,
)

__all__ = [
    "ApiKey",
    "ApiKeyError",
    "ApiKeyStore",
    "KeyLimits",
    "KeyRateLimiter",
    "RateLimited",
    "SecurityConfigError",
    "SecuritySettings",
    "add_security_args",
    "bearer",
    "configure",
    "current",
    "settings_from_args",
]
