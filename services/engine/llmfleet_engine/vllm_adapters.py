"""``VllmAdapters``: the LoRA adapters a vLLM engine serves, handed to vLLM as LoRA requests.

As on the native engine (``lora.hosting.AdapterHost``), ``add(name, base, path)`` declares an adapter,
and whenever ``base`` is loaded (now, or later: the executor's change hook) the adapter is read and
checked with the native engine's checks (``lora.adapter.load_adapter``: the same refusals in the same
words) and registered; its registration goes when ``base`` leaves. The check runs against the base's
architecture built on the meta device (shapes, no weights): the weights live in vLLM's engine core.

vLLM loads the adapter itself: each request of the adapter carries a ``LoRARequest`` (the adapter's
name, an integer id that stays the adapter name's for the executor's life, and its directory), and
vLLM reads it into its cache the first time a request needs it (``max_loras`` adapters in a batch,
ranks up to ``max_lora_rank``). An adapter registered again (``add`` once more) is reloaded by its
next request (``load_inplace``), so the new files replace the ones vLLM holds. With ``zero_dir`` (vLLM's
CPU build) a base's own requests carry the zero adapter written there (``vllm_zero_adapter``).
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from llmfleet_engine.lora.adapter import AdapterError, load_adapter
from llmfleet_engine.lora.pool import DEFAULT_TARGETS
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.vllm_zero_adapter import ZERO_LORA_ID, ZERO_LORA_NAME, write_zero_adapter

log = logging.getLogger(__name__)


class AdapterBases(Protocol):
    """The executor's side the adapters follow: its loaded models (the bases) and their change hook."""

    on_models_changed: list[Callable[[tuple[str, ...]], None]]

    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def serving_model_names(self) -> tuple[str, ...]: ...


@dataclass
class VllmAdapter:
    """A registered adapter: its base, directory, vLLM id and rank."""

    name: str
    base: str
    path: str
    lora_id: int
    rank: int
    reload: bool = False  # registered again: its next LoRA request reloads it in vLLM


class VllmAdapters:
    """The declared and registered adapters of a vLLM engine, keyed by adapter name.

    Thread-safe; never called with the executor's lock held (it takes that lock to read the models).
    """

    def __init__(
        self,
        bases: AdapterBases,
        *,
        max_loras: int,
        max_rank: int,
        lora_request_cls: Any,
        zero_dir: Path | None = None,
    ) -> None:
        self.bases = bases
        self.zero_dir = zero_dir  # where the bases' zero adapters go (None: base requests carry none)
        self._zeros: dict[str, tuple[LoadedModel, Path]] = {}  # base -> its zero adapter
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._lora_request_cls = lora_request_cls
        self._lock = threading.Lock()
        self.registered: dict[str, VllmAdapter] = {}
        self.declared: dict[str, tuple[str, str | Path]] = {}  # name -> (base, directory)
        self._ids: dict[str, int] = {}  # adapter name -> its vLLM id, for the executor's life
        self._names: dict[int, str] = {}
        self._next_id = itertools.count(1)  # vLLM's LoRA ids start at 1
        self._skeletons: dict[str, tuple[LoadedModel, torch.nn.Module]] = {}
        bases.on_models_changed.append(self._bases_changed)

    def add(self, name: str, base: str, path: str | Path) -> VllmAdapter | None:
        """Declares adapter ``name`` of ``base`` at ``path``; when ``base`` is loaded, checks it and
        registers it now (again: replaced), else returns None (registered when ``base`` is loaded).
        AdapterError naming the problem; the engine keeps serving."""
        with self._lock:
            self.declared[name] = (base, path)
            self._id(name)
        if base not in self.bases.models:
            return None
        adapter = self._register(name, base, path)
        for changed in list(self.bases.on_models_changed):  # the node record advertises the adapter
            if changed != self._bases_changed:
                changed(self.serving(self.bases.serving_model_names()))
        return adapter

    def remove(self, name: str) -> bool:
        """Forgets adapter ``name`` (vLLM drops it from its cache when the room is needed)."""
        with self._lock:
            self.registered.pop(name, None)
            return self.declared.pop(name, None) is not None

    def _id(self, name: str) -> int:
        if name not in self._ids:
            self._ids[name] = next(self._next_id)
            self._names[self._ids[name]] = name
        return self._ids[name]

    def _bases_changed(self, _names: tuple[str, ...]) -> None:
        """The loaded models changed (called off the event loop): registrations of a base that left
        go; declared adapters of a loaded base are registered (a bad one is logged)."""
        loaded = self.bases.models
        with self._lock:
            for name in [n for n, a in self.registered.items() if a.base not in loaded]:
                del self.registered[name]
            for base in [b for b, (m, _) in self._skeletons.items() if loaded.get(b) is not m]:
                del self._skeletons[base]
            for base in [b for b, (m, _) in self._zeros.items() if loaded.get(b) is not m]:
                del self._zeros[base]
            zeroless = [(b, m) for b, m in loaded.items() if b not in self._zeros]
            due = [
                (n, b, p) for n, (b, p) in self.declared.items() if b in loaded and n not in self.registered
            ]
        if self.zero_dir is not None:  # before any adapter of the base registers
            for base, model in zeroless:
                self._write_zero(base, model)
        for name, base, path in due:
            try:
                self._register(name, base, path)
            except (AdapterError, OSError, ValueError) as e:
                log.error("%s", e)

    def _register(self, name: str, base: str, path: str | Path) -> VllmAdapter:
        models = self.bases.models
        if name in models:
            raise AdapterError(f"adapter {name!r}: a model of that name is loaded here")
        loaded = models.get(base)
        if loaded is None:
            raise AdapterError(f"adapter {name!r}: base model {base!r} is not loaded here")
        if not self.max_loras:
            raise AdapterError(f"adapter {name!r}: LoRA is off on this engine (max_loras 0)")
        checked = load_adapter(
            name, path, self._skeleton(base, loaded), max_rank=self.max_rank, targets=DEFAULT_TARGETS
        )
        still = self.bases.models.get(base) is loaded
        with self._lock:
            if not still:
                raise AdapterError(f"adapter {name!r}: base model {base!r} was reloaded meanwhile")
            again = self.registered.get(name)
            adapter = VllmAdapter(
                name, base, str(Path(path).resolve()), self._id(name), checked.rank, reload=again is not None
            )
            self.registered[name] = adapter
        log.info("registered LoRA adapter %s (rank %d) of %s from %s", name, checked.rank, base, path)
        return adapter

    def _write_zero(self, base: str, model: LoadedModel) -> None:
        if self.zero_dir is None:
            return
        try:
            path = write_zero_adapter(self._skeleton(base, model), self.zero_dir / f"{base}-{id(model)}")
        except Exception:
            log.exception("cannot write the zero LoRA adapter of %s", base)
            return
        with self._lock:
            self._zeros[base] = (model, path)

    def close(self) -> None:
        """Removes the zero adapters' files."""
        if self.zero_dir is not None:
            shutil.rmtree(self.zero_dir, ignore_errors=True)

    def _skeleton(self, base: str, loaded: LoadedModel) -> torch.nn.Module:
        """``base``'s architecture on the meta device: its Linear layers' shapes, no weights."""
        with self._lock:
            cached = self._skeletons.get(base)
        if cached is not None and cached[0] is loaded:
            return cached[1]
        from transformers import AutoConfig, AutoModelForCausalLM

        config = getattr(loaded, "hf_config", None) or AutoConfig.from_pretrained(loaded.path)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        with self._lock:
            self._skeletons[base] = (loaded, skeleton)
        return skeleton

    def route(self, model: str) -> tuple[str, Any | None]:
        """The model a request of ``model`` runs on and its ``LoRARequest``: an adapter's base and
        its LoRA request, anything else itself and None."""
        with self._lock:
            a = self.registered.get(model)
            if a is None:
                zero = self._zeros.get(model)
                if zero is None:
                    return model, None
                return model, self._lora_request_cls(
                    lora_name=ZERO_LORA_NAME, lora_int_id=ZERO_LORA_ID, lora_path=str(zero[1])
                )
            reload, a.reload = a.reload, False
        return a.base, self._lora_request_cls(
            lora_name=a.name, lora_int_id=a.lora_id, lora_path=a.path, load_inplace=reload
        )

    def name_of(self, lora_id: int) -> str | None:
        """The adapter whose vLLM id is ``lora_id``."""
        with self._lock:
            return self._names.get(lora_id)

    def base_of(self, name: str) -> str | None:
        """The base model of adapter ``name``, or None when ``name`` is not an adapter here."""
        with self._lock:
            a = self.registered.get(name)
        return None if a is None else a.base

    def serving(self, bases: tuple[str, ...]) -> tuple[str, ...]:
        """``bases`` (the models taking requests) and the registered adapters of those bases, sorted:
        what the node record advertises."""
        with self._lock:
            adapters = [n for n, a in self.registered.items() if a.base in bases]
        return tuple(sorted([*bases, *adapters]))

    def with_adapters(self, models: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
        """``models`` plus each registered adapter of one of them, mapped to its base's loaded model
        (its tokenizer and limits validate the adapter's requests)."""
        with self._lock:
            extra = {n: models[a.base] for n, a in self.registered.items() if a.base in models}
        return {**models, **extra}
