"""Draining a model off a vLLM engine node (``VllmDrains``, mixed into ``vllm_backend.VllmExecutor``):
its ``backend.ModelHosting`` drains.

A draining model stops being advertised and the servicer refuses its new requests with UNAVAILABLE;
its running requests go on until they finish, or until the follower evicts them: an evicted request
ends here and its stream answers UNAVAILABLE with the reason, so the scheduler resumes it on another
engine from the tokens it delivered (token transfer: vLLM has no KV export).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from llmfleet_engine.model_host import DrainBook
from llmfleet_engine.outputs import FinishReason


class VllmDrains:
    """Drains of ``VllmExecutor`` (a mixin; ``_lock``, ``_runtimes``, ``_requests``, ``_finish_locked``
    and ``_models_changed`` come from the executor, its models and its requests)."""

    _lock: threading.Lock
    _runtimes: dict[str, Any]
    _requests: dict[str, Any]
    _drains: DrainBook  # the native engine's record of drains and evictions
    _finish_locked: Callable[[Any, FinishReason], None]
    _models_changed: Callable[[], None]

    def begin_drain(self, name: str, reason: str) -> bool:
        """Stop advertising ``name`` and refuse its new requests (``reason`` says why); its running
        requests go on. False if it is not loaded or already draining."""
        with self._lock:
            if name not in self._runtimes or name in self._drains.models:
                return False
            self._drains.models[name] = reason
        self._models_changed()
        return True

    def end_drain(self, name: str) -> bool:
        """Serve ``name`` again; False if it was not draining."""
        with self._lock:
            if self._drains.models.pop(name, None) is None:
                return False
        self._models_changed()
        return True

    def draining_reason(self, name: str) -> str | None:
        with self._lock:
            return self._drains.models.get(name)

    def serving_model_names(self) -> tuple[str, ...]:
        """Loaded models that take new requests: what the node record advertises."""
        with self._lock:
            return tuple(sorted(n for n in self._runtimes if n not in self._drains.models))

    def model_request_ids(self, name: str) -> list[str]:
        with self._lock:
            # an adapter's requests run on its base, whose engine they leave with
            return [
                rid for rid, s in self._requests.items() if s.runtime.model.name == name and not s.finished
            ]

    def evict(self, request_id: str, reason: str) -> bool:
        """End ``request_id`` here so that its consumer resumes it elsewhere; False if not active."""
        with self._lock:
            state = self._requests.get(request_id)
            if state is None or state.finished:
                return False
            self._drains.evicted(request_id, reason)
            self._finish_locked(state, FinishReason.CANCELLED)
        if state.future is not None:
            state.future.cancel()  # its driver aborts the vLLM request
        return True

    def take_eviction(self, request_id: str) -> str | None:
        """Why ``request_id`` was evicted (once; None if it was not)."""
        with self._lock:
            return self._drains.evictions.pop(request_id, None)
