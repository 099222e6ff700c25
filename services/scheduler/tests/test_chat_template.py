"""Chat prompts rendered with the model tokenizer's template (a real ``transformers`` tokenizer saved
to a directory with a ``chat_template``), the default template otherwise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from llmfleet_engine import tokenizer as tiny_tokenizer
from llmfleet_scheduler.chat_template import ChatTemplates, load_renderer, render_default

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = [("system", "Be terse."), ("user", "Hi")]


def chat_tokenizer(root: Path) -> Path:
    d = root / "chat-model"
    d.mkdir()
    tiny_tokenizer.save_tokenizer(d)
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return d


async def test_the_tokenizers_template_renders_with_a_generation_prompt(tmp_path):
    d = chat_tokenizer(tmp_path)
    templates = ChatTemplates({"chat-model": str(d)}.get)
    got = await templates.render("chat-model", MESSAGES)
    assert got == "<|system|>Be terse.</s><|user|>Hi</s><|assistant|>"


async def test_default_template_without_one(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    tiny_tokenizer.save_tokenizer(plain)
    sources = {"tiny": "tiny://llama", "plain": str(plain), "gone": str(tmp_path / "nowhere")}
    templates = ChatTemplates(sources.get)
    want = render_default(MESSAGES)
    assert want == "system: Be terse.\nuser: Hi\nassistant:"
    for model in ("tiny", "plain", "gone", "not-in-etcd"):
        assert await templates.render(model, MESSAGES) == want
    assert load_renderer("tiny://llama") is None


async def test_one_load_per_model_shared_by_concurrent_requests(tmp_path):
    calls: list[str] = []

    def loader(source: str):
        calls.append(source)
        return lambda msgs: "|".join(m["content"] for m in msgs)

    templates = ChatTemplates({"m": "/models/m"}.get, loader=loader)
    out = await asyncio.gather(*(templates.render("m", MESSAGES) for _ in range(20)))
    assert set(out) == {"Be terse.|Hi"} and calls == ["/models/m"]
