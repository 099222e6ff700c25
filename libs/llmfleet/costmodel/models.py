"""Transformer architectures: parameter count, weight bytes and KV bytes per token, plus a catalog.

Parameter count (decoder-only, pre-norm)::

    embed   = V·h                                   (+ P·h learned positions, OPT)
    attn    = h·(H·d) + 2·h·(H_kv·d) + (H·d)·h      (q, k, v, o)  [+ biases]
    mlp     = 3·h·f if gated (SwiGLU) else 2·h·f    [+ biases]
    norms   = 2·h per layer + h final (×2 with LayerNorm bias)
    lm_head = V·h unless tied to the embedding
    params  = embed + L·(attn + mlp + norms) + final norm + lm_head

Llama-2-7B gives 6,738,415,616, the published count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from llmfleet.kvblocks.shapes import DTYPE_BYTES, KvShape


class UnknownModel(KeyError):
    """A model name that is not in :data:`MODEL_CATALOG`."""


@dataclass(frozen=True)
class ModelArch:
    """Shape of a decoder-only transformer; ``dtype`` is the weight and KV-cache dtype."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    max_context: int  # the longest sequence (prompt + output) in tokens: HF's max_position_embeddings
    dtype: str = "float16"
    gated_mlp: bool = True
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: biases on q, k, v only
    linear_bias: bool = False  # OPT: biases on every linear layer, LayerNorm with bias
    learned_positions: int = 0  # OPT: rows of the learned position embedding

    def __post_init__(self) -> None:
        dims = (self.num_layers, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim)
        if min(*dims, self.ffn_size, self.vocab_size, self.max_context) <= 0:
            raise ValueError(f"ModelArch dimensions must be positive: {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; valid: {sorted(DTYPE_BYTES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @cached_property
    def embedding_params(self) -> int:
        """Token (and learned position) embedding tables: lookups, not matmuls."""
        return (self.vocab_size + self.learned_positions) * self.hidden_size

    @cached_property
    def layer_params(self) -> int:
        """One decoder layer: attention + MLP + its two norms."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias or self.linear_bias:
            attn += q + 2 * kv
        if self.linear_bias:
            attn += h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_size
        if self.linear_bias:
            mlp += self.ffn_size + h
        norms = 2 * h * (2 if self.linear_bias else 1)
        return attn + mlp + norms

    @cached_property
    def params(self) -> int:
        """Total parameters: embeddings + layers + final norm + untied lm_head (see module doc)."""
        final_norm = self.hidden_size * (2 if self.linear_bias else 1)
        lm_head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.embedding_params + self.num_layers * self.layer_params + final_norm + lm_head

    @cached_property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: layers + lm_head (2 FLOPs each)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    @cached_property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_shape(self) -> KvShape:
        return KvShape(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """2 · L · H_kv · d · dtype_bytes."""
        return self.kv_shape.bytes_per_token


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = config.get(n) if isinstance(config, dict) else getattr(config, n, None)
        if v is not None:
            return v
    return default


def arch_from_hf_config(config: Any, dtype: str = "float16", name: str | None = None) -> ModelArch:
    """Build a :class:`ModelArch` from a HF ``PretrainedConfig`` (or its dict); OPT names understood."""
    model_type = _get(config, "model_type", default="")
    hidden = int(_get(config, "hidden_size", "d_model", "n_embd"))
    heads = int(_get(config, "num_attention_heads", "n_head"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=hidden // heads))
    is_opt = model_type == "opt"
    return ModelArch(
        name=name or _get(config, "name_or_path", "_name_or_path", default=None) or model_type or "unknown",
        num_layers=int(_get(config, "num_hidden_layers", "n_layer")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_size=int(_get(config, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)),
        vocab_size=int(_get(config, "vocab_size")),
        max_context=int(_get(config, "max_position_embeddings", "seq_length", "n_positions")),
        dtype=dtype,
        gated_mlp=not is_opt,
        tie_embeddings=bool(_get(config, "tie_word_embeddings", default=is_opt)),
        qkv_bias=model_type == "qwen2",
        linear_bias=is_opt and bool(_get(config, "enable_bias", default=True)),
        learned_positions=int(_get(config, "max_position_embeddings")) + 2 if is_opt else 0,
    )


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, context: int, **kw: Any
) -> ModelArch:
    head_dim = kw.pop("head_dim", hidden // heads)
    return ModelArch(name, layers, hidden, heads, kv, head_dim, ffn, vocab, context, **kw)


_CATALOG = [
    # huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    # huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    # huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json (GQA, 8 KV heads)
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, dtype="bfloat16"),
    # huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, dtype="bfloat16"),
    # huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, dtype="bfloat16"),
    # huggingface.co/Qwen/Qwen2-7B/blob/main/config.json (qkv bias, untied lm_head)
    _llama("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, 131072, dtype="bfloat16", qkv_bias=True),
    # huggingface.co/Qwen/Qwen3-32B/blob/main/config.json: head_dim 128 (not hidden / heads), no attention
    # bias, untied lm_head (its per-head q/k RMSNorms, 256 parameters a layer, are left out)
    _llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960, dtype="bfloat16", head_dim=128),
    # huggingface.co/THUDM/chatglm2-6b/blob/main/config.json: num_layers 28, hidden_size 4096, 32 heads of
    # kv_channels 128, multi-query attention with multi_query_group_num 2 (2 KV heads), SwiGLU
    # ffn_hidden_size 13696, padded_vocab_size 65024, add_qkv_bias, no other bias, untied output layer
    _llama("chatglm2-6b", 28, 4096, 32, 2, 13696, 65024, 32768, qkv_bias=True),
    # huggingface.co/facebook/opt-6.7b/blob/main/config.json (ReLU MLP, biases, learned positions 2048+2)
    _llama(
        "opt-6.7b",
        32,
        4096,
        32,
        32,
        16384,
        50272,
        2048,
        gated_mlp=False,
        tie_embeddings=True,
        linear_bias=True,
        learned_positions=2050,
    ),
    # services/engine/llmfleet_engine/models.py TINY_ARCHS (vocab 512 from the tiny tokenizer, float32)
    _llama("tiny-llama", 2, 64, 4, 2, 256, 512, 2048, dtype="float32"),
    _llama("tiny-qwen2", 3, 96, 4, 2, 256, 512, 2048, dtype="float32", tie_embeddings=True, qkv_bias=True),
    _llama("tiny-mistral", 2, 128, 4, 2, 256, 512, 2048, dtype="float32"),
]
MODEL_CATALOG: dict[str, ModelArch] = {a.name: a for a in _CATALOG}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


_BY_KEY = {_key(n): a for n, a in MODEL_CATALOG.items()}


def model_arch(name: str) -> ModelArch:
    """Catalog lookup ignoring case and punctuation ("Llama-2-7B" finds "llama2-7b").

    Raises :class:`UnknownModel` listing the valid names.
    """
    arch = _BY_KEY.get(_key(name))
    if arch is None:
        raise UnknownModel(f"unknown model {name!r}; valid: {sorted(MODEL_CATALOG)}")
    return arch
