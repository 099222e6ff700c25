"""The paged runner's direct path through a Llama-family decoder layer.

When every module of the layers is the plain HF one (``nn.Linear`` projections, the family's RMSNorm
and gated MLP) on the CPU, the runner calls the weights with ``F.linear`` itself instead of going
through ``nn.Module.__call__`` (hooks, dispatch: a few microseconds per call, which on a small model
is a large part of a layer), and RMSNorm in fp32 is ``F.rms_norm`` (bitwise HF's
``weight * x * rsqrt(mean(x²) + eps)`` on the CPU; other dtypes call the module).

(Fusing q/k/v and gate/up into one GEMM each was measured too: bitwise the same outputs, but only
2-4% faster per decode step and slower on prefills, for re-pointing the model's parameters: not kept.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.mistral.modeling_mistral import MistralMLP, MistralRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm

NORMS = (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm)  # weight * x·rsqrt(mean(x²) + eps), in fp32
MLPS = (LlamaMLP, MistralMLP, Qwen2MLP)  # down(act(gate(x)) * up(x))

Weights = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True, slots=True)
class DirectLayer:
    ln1: Callable[[torch.Tensor], torch.Tensor]
    ln2: Callable[[torch.Tensor], torch.Tensor]
    q: Weights
    k: Weights
    v: Weights
    o: Weights
    gate: Weights
    up: Weights
    down: Weights
    act: Callable[[torch.Tensor], torch.Tensor]


def norm_fn(norm: Any, dtype: torch.dtype, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """HF's RMSNorm; as ``F.rms_norm`` for fp32 on the CPU (bitwise the same there, one op)."""
    if dtype == torch.float32 and device.type == "cpu" and type(norm) in NORMS:
        w, eps, shape = norm.weight, norm.variance_epsilon, (norm.weight.shape[0],)
        return lambda x: F.rms_norm(x, shape, w, eps)
    return norm


def direct_layers(layers: list[Any], dtype: torch.dtype, device: torch.device) -> list[DirectLayer] | None:
    """The direct path of ``layers``, or None (call the modules) unless all are plain HF modules on the
    CPU."""
    if device.type != "cpu":
        return None
    lin = torch.nn.Linear
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        projs = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if type(m) not in MLPS or any(type(p) is not lin for p in projs):
            return None
        if type(layer.input_layernorm) not in NORMS or type(layer.post_attention_layernorm) not in NORMS:
            return None
    out = []
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        act = F.silu if type(m.act_fn).__name__ in ("SiLUActivation", "SiLU") else m.act_fn
        out.append(
            DirectLayer(
                norm_fn(layer.input_layernorm, dtype, device),
                norm_fn(layer.post_attention_layernorm, dtype, device),
                *[(p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)],
                *[(p.weight, p.bias) for p in (m.gate_proj, m.up_proj, m.down_proj)],
                act,
            )
        )
    return out
