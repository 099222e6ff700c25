"""Reading a LoRA adapter in PEFT's saved format and checking it against the base model it serves.

A directory holds ``adapter_config.json`` (a ``peft.LoraConfig``) and ``adapter_model.safetensors``
(``...<module>.lora_A.weight`` ``[r, in]`` and ``...<module>.lora_B.weight`` ``[out, r]`` per target
module). PEFT reads both (``LoraConfig.from_pretrained``, ``load_peft_weights``); this module checks that
every tensor names a Linear of the base with matching dimensions, that the rank fits the pool, and
that the adapter uses nothing the batched computation leaves out (DoRA, biases, extra trained
modules). The scale (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) is folded into B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftType
from peft.utils import load_peft_weights

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_SUFFIXES = {".lora_A.weight": 0, ".lora_B.weight": 1}


class AdapterError(ValueError):
    """An adapter that cannot serve its base: the message names the problem."""


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter read from disk: ``weights`` maps a base module path (``model.layers.0.self_attn.q_proj``)
    to ``(A [r, in], B·scale [out, r])`` in the base's dtype, on the CPU."""

    name: str
    path: str
    rank: int
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def _config(name: str, path: Path) -> LoraConfig:
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / f).is_file():
            raise AdapterError(f"adapter {name!r}: {path / f} is missing (PEFT's saved format needs {f})")
    config = LoraConfig.from_pretrained(str(path))
    if config.peft_type != PeftType.LORA:
        raise AdapterError(f"adapter {name!r}: {path} is a {config.peft_type} adapter, not LoRA")
    unsupported = {
        "use_dora": config.use_dora,
        "bias": config.bias != "none",
        "lora_bias": getattr(config, "lora_bias", False),
        "modules_to_save": bool(config.modules_to_save),
        "fan_in_fan_out": config.fan_in_fan_out,
        "rank_pattern": bool(getattr(config, "rank_pattern", None)),
        "alpha_pattern": bool(getattr(config, "alpha_pattern", None)),
        "layer_replication": bool(getattr(config, "layer_replication", None)),
    }
    named = sorted(k for k, v in unsupported.items() if v)
    if named:
        raise AdapterError(
            f"adapter {name!r}: {', '.join(named)} not supported (plain LoRA on Linear layers)"
        )
    return config


def _split(name: str, key: str) -> tuple[str, int]:
    """``base_model.model.<module>.lora_A.weight`` -> (module path, 0 for A / 1 for B)."""
    for suffix, which in _SUFFIXES.items():
        if key.startswith(_PREFIX) and key.endswith(suffix):
            return key[len(_PREFIX) : -len(suffix)], which
    raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight of a Linear layer")


def _linear_dims(base: Any, name: str, module: str, targets: frozenset[str]) -> tuple[int, int]:
    """(in, out) of the base's Linear ``module``, which must be one of the pool's ``targets``."""
    leaf = module.rsplit(".", 1)[-1]
    if leaf not in targets:
        raise AdapterError(
            f"adapter {name!r}: targets {module!r}; the engine's LoRA targets are {sorted(targets)}"
        )
    try:
        layer = base.get_submodule(module)
    except AttributeError:
        raise AdapterError(f"adapter {name!r}: the base model has no module {module!r}") from None
    return int(layer.in_features), int(layer.out_features)


def load_adapter(
    name: str, path: str | Path, base: Any, *, max_rank: int, targets: frozenset[str]
) -> LoraAdapter:
    """Reads and checks the adapter at ``path`` for ``base`` (a loaded HF causal LM): AdapterError
    naming a missing file, a tensor of the wrong shape, a rank above ``max_rank`` or an unsupported
    option."""
    p = Path(path)
    config = _config(name, p)
    scale = config.lora_alpha / (math.sqrt(config.r) if config.use_rslora else config.r)
    tensors = load_peft_weights(str(p), device="cpu")
    pairs: dict[str, list[torch.Tensor | None]] = {}
    for key, t in tensors.items():
        module, which = _split(name, key)
        pairs.setdefault(module, [None, None])[which] = t
    if not pairs:
        raise AdapterError(f"adapter {name!r}: {p / WEIGHTS_FILE} holds no LoRA weights")
    dtype = next(base.parameters()).dtype
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    rank = 0
    for module, (a, b) in sorted(pairs.items()):
        if a is None or b is None:
            raise AdapterError(
                f"adapter {name!r}: {module!r} has {'B' if a is None else 'A'} without its pair"
            )
        d_in, d_out = _linear_dims(base, name, module, targets)
        r = a.shape[0]
        if a.shape != (r, d_in) or b.shape != (d_out, r):
            raise AdapterError(
                f"adapter {name!r}: {module!r} has A {tuple(a.shape)} and B {tuple(b.shape)}; the base's "
                f"Linear is {d_in} -> {d_out}, so A must be [r, {d_in}] and B [{d_out}, r] (another base?)"
            )
        if r > max_rank:
            raise AdapterError(
                f"adapter {name!r}: rank {r} of {module!r} exceeds the engine's max rank {max_rank}"
            )
        rank = max(rank, r)
        weights[module] = (a.to(dtype).contiguous(), (b.to(torch.float32) * scale).to(dtype).contiguous())
    return LoraAdapter(name, str(p), rank, weights)
