"""Materializing tiny models and loading them through from_pretrained like real checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmfleet.types import ModelSpec
from llmfleet_engine.models import (
    TINY_ARCHS,
    LoadedModel,
    ModelLoadError,
    ModelSourceNotFound,
    load_model,
    materialize,
)
from safetensors.torch import load_file


@pytest.mark.parametrize("fixture", ["llama", "qwen2"])
def test_loaded_tiny_model_facts(fixture: str, request: pytest.FixtureRequest) -> None:
    m: LoadedModel = request.getfixturevalue(fixture)
    cfg = m.model.config
    assert m.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[fixture]
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    assert cfg.vocab_size == len(m.tokenizer) == m.vocab_size
    assert m.max_context == cfg.max_position_embeddings == 2048
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert m.kv_bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
    assert m.weight_bytes == sum(p.numel() * 4 for p in m.model.parameters())
    assert m.eos_token_ids == frozenset({m.tokenizer.eos_token_id})
    assert Path(m.path).name.startswith(f"{fixture}-")
    assert (Path(m.path) / "config.json").exists() and (Path(m.path) / "tokenizer.json").exists()
    assert not m.model.training


def test_materialize_reuses_cache(cache_dir: Path, llama: LoadedModel) -> None:
    path = materialize("tiny://llama", cache_dir)
    assert path == llama.path
    stamp = (Path(path) / "model.safetensors").stat().st_mtime_ns
    assert materialize("tiny://llama", cache_dir) == path
    assert (Path(path) / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in Path(cache_dir).iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_tiny_build_is_deterministic(tmp_path: Path, llama: LoadedModel) -> None:
    other = materialize("tiny://llama", tmp_path)
    assert Path(other).name == Path(llama.path).name
    a = load_file(str(Path(llama.path) / "model.safetensors"))
    b = load_file(str(Path(other) / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_local_directory_source(llama: LoadedModel) -> None:
    assert materialize(llama.path) == llama.path
    m = load_model(ModelSpec("local", llama.path, "bfloat16"))
    assert m.architecture == "LlamaForCausalLM"
    assert next(m.model.parameters()).dtype == torch.bfloat16
    assert m.kv_bytes_per_token == llama.kv_bytes_per_token // 2
    assert m.weight_bytes == llama.weight_bytes // 2


def test_mistral_builds(cache_dir: Path) -> None:
    assert "mistral" in TINY_ARCHS
    m = load_model(ModelSpec("m", "tiny://mistral"), cache_dir=cache_dir)
    assert m.architecture == "MistralForCausalLM"


@pytest.mark.parametrize(
    ("source", "error", "needle"),
    [
        ("tiny://gpt9", ModelSourceNotFound, "gpt9"),
        ("/definitely/not/here", ModelSourceNotFound, "/definitely/not/here"),
        ("./missing-dir", ModelSourceNotFound, "missing-dir"),
        ("no-such-org/no-such-model", ModelSourceNotFound, "no-such-org/no-such-model"),
        ("", ModelLoadError, "empty"),
    ],
)
def test_bad_sources(cache_dir: Path, source: str, error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=None) as info:
        load_model(ModelSpec("bad", source), cache_dir=cache_dir, allow_download=False)
    assert needle in str(info.value)


def test_bad_dtype_and_file_source(cache_dir: Path, llama: LoadedModel) -> None:
    with pytest.raises(ModelLoadError, match="int3"):
        load_model(ModelSpec("bad", "tiny://llama", "int3"), cache_dir=cache_dir)
    with pytest.raises(ModelLoadError, match="file"):
        load_model(ModelSpec("bad", str(Path(llama.path) / "config.json")), cache_dir=cache_dir)


def test_directory_without_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        load_model(ModelSpec("empty", str(tmp_path)))
