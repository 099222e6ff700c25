"""Shared fixtures: one tiny-model cache per session, executors loaded with tiny llama and qwen2."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import transformers
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel, load_model

NUM_THREADS = int(os.environ.get("LLMFLEET_TEST_THREADS", "2"))
torch.set_num_threads(NUM_THREADS)
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

LLAMA = ModelSpec(name="tiny-llama", source="tiny://llama")
QWEN2 = ModelSpec(name="tiny-qwen2", source="tiny://qwen2")
PROMPTS = (
    "The quick brown fox",
    "Once upon a time there was a little town by the river.",
    "Question: What is the capital of France? Answer:",
    "Good morning! How are you today?",
    "def add(a, b):",
    "héllo wörld, 日本語 🙂",
    "Numbers: 1 2 3",
    "She opened the door and looked outside.",
)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama(cache_dir: Path) -> LoadedModel:
    return load_model(LLAMA, cache_dir=cache_dir)


@pytest.fixture(scope="session")
def qwen2(cache_dir: Path) -> LoadedModel:
    return load_model(QWEN2, cache_dir=cache_dir)


@pytest.fixture(scope="session")
def endless(llama: LoadedModel) -> LoadedModel:
    """Tiny llama without EOS ids: runs until max_tokens or cancellation (for long-running requests)."""
    return dataclasses.replace(llama, name="tiny-llama-endless", eos_token_ids=frozenset())


@pytest.fixture
def make_executor(cache_dir: Path, llama: LoadedModel, qwen2: LoadedModel, endless: LoadedModel) -> Iterator:
    """Factory for executors holding the session's tiny llama, qwen2 and endless llama; closed after."""
    made: list[Executor] = []

    def make(**overrides: object) -> Executor:
        base = ExecutorConfig(cache_dir=cache_dir, num_threads=NUM_THREADS, allow_download=False)
        executor = Executor(dataclasses.replace(base, **overrides))
        executor.host.add_loaded(llama)
        executor.host.add_loaded(qwen2)
        executor.host.add_loaded(endless)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()


@pytest.fixture
def executor(make_executor) -> Executor:
    return make_executor()


def _hf_greedy(model: LoadedModel, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Reference: ``model.generate`` greedy continuation, cut before the first EOS."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        out = model.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=model.tokenizer.pad_token_id,
        )
    new = out[0, input_ids.shape[1] :].tolist()
    for i, token in enumerate(new):
        if token in model.eos_token_ids:
            return new[:i]
    return new


def _long_prompt(model: LoadedModel, n: int, skip: int = 0) -> str:
    """The ``skip``-th prompt of PROMPTS whose greedy continuation runs ``n`` tokens without EOS."""
    for prompt in PROMPTS:
        if len(_hf_greedy(model, model.tokenizer(prompt)["input_ids"], n)) == n:
            if skip == 0:
                return prompt
            skip -= 1
    raise AssertionError(f"no test prompt runs {n} tokens without EOS on {model.name}")


@pytest.fixture(scope="session")
def prompts() -> tuple[str, ...]:
    return PROMPTS


@pytest.fixture(scope="session")
def hf_greedy():
    """``hf_greedy(model, prompt_ids, n)``: the HF ``generate`` greedy reference (see ``_hf_greedy``)."""
    return _hf_greedy


@pytest.fixture(scope="session")
def long_prompt():
    """``long_prompt(model, n, skip=0)``: a prompt whose greedy output runs n tokens without EOS."""
    return _long_prompt


MISTRAL = ModelSpec(name="tiny-mistral", source="tiny://mistral")


@pytest.fixture(scope="session")
def mistral(cache_dir: Path) -> LoadedModel:
    return load_model(MISTRAL, cache_dir=cache_dir)
