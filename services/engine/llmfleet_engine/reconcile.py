"""Bring an executor's loaded models to a desired set (shared by every backend).

Order: load the new models first, then unload the ones no longer desired, so a model arriving never
waits for one leaving. A load that does not fit beside the models still loaded (``ResourceExhaustedError``)
and a desired model loaded from another source or dtype (same name) are retried after the unloads.
This is the immediate form (an unloaded model's requests end with it); the placement follower drains
a leaving model first on backends that can (``placement_follower``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from llmfleet.types import ModelSpec

from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import LoadResult, ReconcileResult, ResourceExhaustedError


class _Backend(Protocol):
    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def load(self, spec: ModelSpec) -> LoadResult: ...

    def unload(self, name: str) -> bool: ...


def is_stale(spec: ModelSpec | None, model: LoadedModel) -> bool:
    """``model`` is not what ``spec`` asks for (not desired, or another source, dtype or device map)."""
    return spec is None or not model.serves(spec)


def reconcile(
    backend: _Backend, desired: Iterable[ModelSpec], errors: tuple[type[Exception], ...]
) -> ReconcileResult:
    """Load what is missing, then unload what is not desired (or desired from another source/dtype),
    then retry the loads that needed those unloads; load failures of the types in ``errors`` are
    reported, not raised."""
    want = {s.name: s for s in desired}
    result = ReconcileResult()
    loaded = backend.models
    stale = [name for name, model in loaded.items() if is_stale(want.get(name), model)]
    later: list[ModelSpec] = []

    def load(spec: ModelSpec, retry: bool) -> None:
        try:
            if not backend.load(spec).already_loaded:
                result.loaded.append(spec.name)
        except errors as e:
            if not retry and isinstance(e, ResourceExhaustedError) and stale:
                later.append(spec)  # may fit once the leaving models are gone
            else:
                result.errors[spec.name] = str(e)

    for name, spec in want.items():
        if name in loaded and name in stale:
            later.append(spec)  # same name, new source: after the old one is unloaded
        else:
            load(spec, retry=False)
    for name in stale:
        if backend.unload(name):
            result.unloaded.append(name)
    for spec in later:
        load(spec, retry=True)
    return result
