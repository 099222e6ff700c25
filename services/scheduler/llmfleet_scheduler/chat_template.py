"""Chat messages -> one prompt string, rendered in the scheduler.

The scheduler holds no tokenizer (engines load models; the scheduler only routes), so it cannot apply
a model's own chat template. It renders a plain default template instead, one ``role: content`` line
per message followed by ``assistant:`` (the generation prompt)::

    system: You are terse.
    user: Hi
    assistant:

This is what the tiny demo models (no chat template) get in any case. Models with a real template
are served correctly only if their template is applied by the client (use ``/v1/completions``)."""

from __future__ import annotations

from collections.abc import Iterable


def render_default(messages: Iterable[tuple[str, str]]) -> str:
    lines = [f"{role}: {content}" for role, content in messages]
    lines.append("assistant:")
    return "\n".join(lines)
