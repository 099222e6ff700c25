"""Bring an executor's loaded models to a desired set (shared by every backend)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from llmfleet.types import ModelSpec

from llmfleet_engine.models import DEFAULT_DTYPE, LoadedModel
from llmfleet_engine.outputs import LoadResult, ReconcileResult


class _Backend(Protocol):
    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def load(self, spec: ModelSpec) -> LoadResult: ...

    def unload(self, name: str) -> bool: ...


def reconcile(
    backend: _Backend, desired: Iterable[ModelSpec], errors: tuple[type[Exception], ...]
) -> ReconcileResult:
    """Unload what is not desired (or desired from another source/dtype), then load what is missing;
    load failures of the types in ``errors`` are reported, not raised."""
    want = {s.name: s for s in desired}
    result = ReconcileResult()
    for name, model in backend.models.items():
        spec = want.get(name)
        stale = spec is None or (spec.source, spec.dtype or DEFAULT_DTYPE) != (model.source, model.dtype)
        if stale and backend.unload(name):
            result.unloaded.append(name)
    for name, spec in want.items():
        try:
            if not backend.load(spec).already_loaded:
                result.loaded.append(name)
        except errors as e:
            result.errors[name] = str(e)
    return result
