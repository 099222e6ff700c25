"""Chat messages -> one prompt string, rendered in the scheduler with the model tokenizer's template.

``ChatTemplates`` loads each model's tokenizer once (``transformers.AutoTokenizer`` from the model's
source in etcd ``models/{name}``: a local checkpoint directory or a hub id, in a worker thread) and
renders with its ``apply_chat_template(..., add_generation_prompt=True)``. Models without a template
(the tiny demo models, ``tiny://`` sources, a tokenizer that cannot be loaded here) get a plain
default template: one ``role: content`` line per message followed by ``assistant:``::

    system: You are terse.
    user: Hi
    assistant:
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Renderer = Callable[[list[dict[str, str]]], str]


def render_default(messages: Iterable[tuple[str, str]]) -> str:
    lines = [f"{role}: {content}" for role, content in messages]
    lines.append("assistant:")
    return "\n".join(lines)


def load_renderer(source: str) -> Renderer | None:
    """The tokenizer's chat template for ``source`` as a renderer; None when it has none (raises when
    the tokenizer cannot be loaded). Offline (``HF_HUB_OFFLINE=1``) only local files are read."""
    if source.startswith("tiny://"):
        return None
    from transformers import AutoTokenizer

    local_only = os.environ.get("HF_HUB_OFFLINE", "") in {"1", "true", "yes"}
    tok: Any = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    if not getattr(tok, "chat_template", None):
        return None

    def render(messages: list[dict[str, str]]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return render


@dataclass
class ChatTemplates:
    """model name -> its renderer, loaded once per (model, source); ``source_of`` reads etcd's models/."""

    source_of: Callable[[str], str | None]
    loader: Callable[[str], Renderer | None] = load_renderer
    _cache: dict[tuple[str, str], asyncio.Future] = field(default_factory=dict)

    async def render(self, model: str, messages: Sequence[tuple[str, str]]) -> str:
        source = self.source_of(model)
        renderer = await self._renderer(model, source) if source else None
        if renderer is None:
            return render_default(messages)
        return renderer([{"role": r, "content": c} for r, c in messages])

    async def _renderer(self, model: str, source: str) -> Renderer | None:
        key = (model, source)
        fut = self._cache.get(key)
        if fut is None:  # one load per model, shared by concurrent requests
            fut = self._cache[key] = asyncio.ensure_future(self._load(model, source))
        return await asyncio.shield(fut)

    async def _load(self, model: str, source: str) -> Renderer | None:
        try:
            renderer = await asyncio.to_thread(self.loader, source)
        except Exception as e:  # no tokenizer here (a hub id offline, a path only engines see)
            log.warning(
                "chat template of %s (%s) not loaded (%s); using the default template", model, source, e
            )
            return None
        log.info(
            "chat template of %s: %s",
            model,
            "the tokenizer's" if renderer else "the default (none in the tokenizer)",
        )
        return renderer
