"""``LoraLinear``: a base Linear plus the batched LoRA delta of each token's adapter.

The adapter pool stacks every slot's weights of one module side by side: ``a`` is ``[in, S·R]`` (slot
``s`` owns columns ``[s·R, (s+1)·R)``, rank ``r <= R`` zero-padded) and ``b`` is ``[S·R, out]`` (B
pre-scaled). A step's ``StepMask`` is ``[T, C]``, 1 where column ``c`` belongs to token ``t``'s slot
and 0 elsewhere (all 0 for a token of the base), over the first ``C`` columns (up to the highest slot
the step uses). Then for every token at once

    y = x·Wᵀ + bias + ((x · a[:, :C]) ⊙ mask) · b[:C]

two small matmuls whatever the mix of adapters (the punica idea with the gather replaced by the mask:
a token multiplies the other slots' columns too, ``C·(in + out)`` flops against ``in·out``, and no
per-token copy of its adapter's weights is made). Without a mask (no adapter in the step) the module
is the base Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class StepMask:
    """The current forward's token -> adapter columns mask, shared by every ``LoraLinear`` of a model."""

    __slots__ = ("cols", "mask")

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.cols = 0

    def set(self, mask: torch.Tensor | None) -> None:
        self.mask = mask
        self.cols = 0 if mask is None else int(mask.shape[1])


class LoraLinear(nn.Module):
    """``base`` (an ``nn.Linear``) plus the delta of the pool's stacked ``a`` / ``b`` under ``step``."""

    def __init__(self, base: nn.Linear, a: torch.Tensor, b: torch.Tensor, step: StepMask) -> None:
        super().__init__()
        self.base = base
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.register_buffer("lora_a", a, persistent=False)
        self.register_buffer("lora_b", b, persistent=False)
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.base.weight, self.base.bias)
        mask = self.step.mask
        if mask is None:
            return y
        c = self.step.cols
        return torch.addmm(y, (x @ self.lora_a[:, :c]).mul_(mask), self.lora_b[:c])
