"""``PagedRunner``: one forward per iteration over a mixed prefill/decode batch, KV in ``KvStorage``.

The runner drives a loaded Hugging Face causal LM of the Llama family (``LlamaForCausalLM``,
``MistralForCausalLM``, ``Qwen2ForCausalLM``) with the model's own modules and weights: embeddings,
each decoder layer's norms, q/k/v/o projections (Qwen2's qkv biases included), MLP, the final norm,
``lm_head``, the model's rotary embedding module and the architecture's ``apply_rotary_pos_emb``. Only
attention is replaced (see ``attention.py``): the new tokens of all sequences form ONE ``[T, hidden]``
activation, so every projection, norm and MLP runs once per layer for the whole batch.

Sliding windows: Mistral's ``config.sliding_window`` (all layers) and Qwen2's sliding layers
(``layer_types``) are applied in the attention mask with HF's semantics, so contexts longer than the
window are served (keys older than the window are not read). Contexts beyond
``config.max_position_embeddings`` are rejected.

Per-iteration host overhead is kept small, since on small models it is most of an iteration: every
index of a forward (token ids, positions, slots, the attention plans' block ids) travels to the device
in ONE packed tensor; on the CPU, when the layers are the plain HF modules, their weights are called
directly (``direct.py``); RoPE is ``x·cos + roll(x)·sin±`` (bitwise HF's ``rotate_half`` form) and
the cos/sin of static RoPE types come from a table grown on demand.

Block bookkeeping is the caller's: each ``SeqStep`` names the sequence's block table after allocation
and the slots of its new tokens; the runner checks that they agree with each other and with the pool.

LoRA: with an ``AdapterPool`` attached to the model (``lora=``), each ``SeqStep.adapter`` names its
adapter's slot (-1: the base) and the forward sets the pool's per-token mask first, so sequences of
different adapters share the batch (``llmfleet_engine/lora``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from llmfleet.kvblocks.shapes import KvShape
from llmfleet.kvblocks.storage import KvStorage, dtype_name
from transformers import LlamaForCausalLM, MistralForCausalLM, PretrainedConfig, Qwen2ForCausalLM

from llmfleet_engine.native.attention import BatchLayout, Packer, build_plan, paged_attention
from llmfleet_engine.native.direct import direct_layers, norm_fn

if TYPE_CHECKING:
    from llmfleet_engine.lora import AdapterPool

SUPPORTED_MODELS: tuple[type, ...] = (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)
_STATIC_ROPE = ("default", "linear", "llama3")  # cos/sin depend on the position only

Ints = Sequence[int] | torch.Tensor


class UnsupportedModelError(ValueError):
    """The model is not of an architecture the paged runner implements."""


@dataclass(frozen=True, slots=True)
class SeqStep:
    """One sequence's part of an iteration.

    ``token_ids``: the NEW tokens (a prompt, a prompt chunk, or one decode token); ``start_pos``: tokens
    already in the KV; ``blocks``: the block table after allocating the new slots; ``slots_block`` /
    ``slots_offset``: where the new tokens' K/V go (one per new token; they must equal
    ``blocks[p // T_m], p % T_m`` for ``p = start_pos + i``). Sequences of ints or CPU LongTensors
    (everything is packed into one host buffer and copied to the device once per forward).
    ``adapter``: the slot of the sequence's LoRA adapter in the runner's adapter pool (-1: the base).
    The K/V of positions ``[0, start_pos)`` must already be in ``blocks`` (earlier steps or an import).
    """

    token_ids: Ints
    start_pos: int
    blocks: Ints
    slots_block: Ints
    slots_offset: Ints
    adapter: int = -1


def kv_shape_of(config: PretrainedConfig, dtype: torch.dtype | str) -> KvShape:
    """The KV geometry (layers, KV heads, head dim, dtype) of a Llama-family config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KvShape(
        num_layers=config.num_hidden_layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype_name(dtype)
    )


def _ints(x: Ints) -> list[int]:
    if isinstance(x, list):
        return x
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


class PagedRunner:
    """Runs ``model`` over KV in ``storage`` (registered there under ``name``). With ``direct`` the
    layers run as direct weight calls (``F.linear``, ``F.rms_norm``) where the model allows it;
    without, through the HF modules."""

    def __init__(
        self,
        model: Any,
        storage: KvStorage,
        name: str,
        *,
        check_slots: bool = True,
        direct: bool = True,
        lora: AdapterPool | None = None,
    ) -> None:
        if type(model) not in SUPPORTED_MODELS:  # exact classes: a subclass may change the math
            names = ", ".join(c.__name__ for c in SUPPORTED_MODELS)
            raise UnsupportedModelError(
                f"PagedRunner supports {names}; got {type(model).__name__} "
                f"(model_type {getattr(getattr(model, 'config', None), 'model_type', '?')!r})"
            )
        config = model.config
        param = next(model.parameters())
        if torch.device(param.device) != storage.device:
            raise ValueError(f"model is on {param.device} but the KV storage is on {storage.device}")
        self.model = model
        self.config = config
        self.name = name
        self.storage = storage
        self.dtype = param.dtype
        self.device = storage.device
        self.shape = kv_shape_of(config, self.dtype)
        base = model.model
        self._embed = base.embed_tokens
        self._norm = base.norm
        self._rotary = base.rotary_emb
        self._lm_head = model.lm_head
        self._layers = list(base.layers[: config.num_hidden_layers])
        attn0 = self._layers[0].self_attn
        if attn0.head_dim != self.shape.head_dim:
            raise UnsupportedModelError(
                f"attention head_dim {attn0.head_dim} != config {self.shape.head_dim}"
            )
        self._scales = [float(layer.self_attn.scaling) for layer in self._layers]
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 0) or None
        self.windows = [self._window_of(layer) for layer in self._layers]
        self._window_set = sorted(set(self.windows), key=lambda w: -1 if w is None else w)
        self._direct = direct_layers(self._layers, self.dtype, self.device) if direct else None
        self._final_norm = norm_fn(self._norm, self.dtype, self.device) if self._direct else self._norm
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rope_static = getattr(self._rotary, "rope_type", None) in _STATIC_ROPE
        self.check_slots = check_slots
        self.lora = lora
        storage.register(name, self.shape)
        self.tokens_per_block = storage.tokens_per_block(name)
        view = storage.view(name)
        self._layer_slots = [storage.layer_view(name, i) for i in range(self.shape.num_layers)]
        self._layer_blocks = [view[:, i] for i in range(self.shape.num_layers)]

    @property
    def direct(self) -> bool:
        """Whether the layers run as direct weight calls rather than through the HF modules."""
        return self._direct is not None

    @property
    def rope_positions(self) -> int:
        """The positions the cached RoPE table covers (0 before a static RoPE first needs it)."""
        return 0 if self._rope_table is None else int(self._rope_table[0].shape[0])

    def _window_of(self, layer: Any) -> int | None:
        if isinstance(self.model, MistralForCausalLM):
            w = getattr(self.config, "sliding_window", None)
        else:  # Qwen2 sliding layers carry their window; Llama has none
            w = getattr(layer.self_attn, "sliding_window", None)
        if w is None or (self.max_context is not None and w >= self.max_context):
            return None  # the window can never bite
        return int(w)

    def _cos_sin(self, h: torch.Tensor, pos: torch.Tensor, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin (``sin`` with its first half negated, for ``roll``) of ``pos``."""
        if self._rope_static:
            table = self._rope_table
            if table is None or table[0].shape[0] <= max_pos:
                n = 1 << max(6, max_pos.bit_length())  # grown by doubling
                cos, sin = self._rotary(h[None], torch.arange(n, device=h.device)[None])
                half = cos.shape[-1] // 2
                table = self._rope_table = (cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1))
            return table[0].index_select(0, pos), table[1].index_select(0, pos)
        cos, sin = self._rotary(h[None], pos[None])
        half = cos.shape[-1] // 2
        return cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)

    def close(self) -> None:
        """Unregister from the storage (the blocks themselves belong to the allocator)."""
        if self.name in self.storage:
            self.storage.unregister(self.name)

    # ------------------------------------------------------------------ API
    def forward(self, seqs: Sequence[SeqStep]) -> torch.Tensor:
        """float32 logits ``[num_seqs, vocab]`` of each sequence's LAST new token."""
        return self._run(seqs, all_positions=False)

    __call__ = forward

    def forward_all(self, seqs: Sequence[SeqStep]) -> list[torch.Tensor]:
        """float32 logits of every new token: one ``[len(token_ids), vocab]`` tensor per sequence."""
        return self._run(seqs, all_positions=True)

    # ------------------------------------------------------------ internals
    def _token_adapters(self, seqs: Sequence[SeqStep], order: list[int]) -> list[int] | None:
        """Each token's adapter slot in the layout's order, or None when no sequence has an adapter."""
        if all(s.adapter < 0 for s in seqs):
            return None
        if self.lora is None:
            raise ValueError("a sequence names an adapter but the runner has no adapter pool")
        top = self.lora.max_adapters
        out: list[int] = []
        for i in order:
            s = seqs[i]
            if s.adapter >= top:
                raise ValueError(f"sequence {i}: adapter slot {s.adapter} outside the pool's {top} slots")
            out += [s.adapter] * len(_ints(s.token_ids))
        return out

    def _layout(self, seqs: Sequence[SeqStep]) -> tuple[BatchLayout, list[int], list[int]]:
        """Checks the steps; the decode-first layout, the order (internal -> caller's index) and the
        flat host indices ``ids + positions + slot blocks + slot offsets``."""
        t_m = self.tokens_per_block
        nblk = self.storage.num_blocks
        max_ctx = self.max_context or (1 << 62)
        check = self.check_slots
        decodes: list[int] = []
        others: list[int] = []
        cols: list[tuple[list[int], list[int], list[int], list[int], int]] = []
        for i, s in enumerate(seqs):
            t, blocks, b, o = _ints(s.token_ids), _ints(s.blocks), _ints(s.slots_block), _ints(s.slots_offset)
            n, p0 = len(t), int(s.start_pos)
            end = p0 + n
            if n == 0 or p0 < 0 or len(b) != n or len(o) != n:
                raise ValueError(
                    f"sequence {i}: needs new tokens, start_pos >= 0 and one slot per token; got "
                    f"{n} new tokens, start_pos {p0}, {len(b)} slot blocks / {len(o)} offsets"
                )
            if end > len(blocks) * t_m:
                raise ValueError(
                    f"sequence {i}: context of {end} tokens does not fit its {len(blocks)} blocks of {t_m} tokens"
                )
            if end > max_ctx:
                raise ValueError(f"sequence {i}: context {end} exceeds the model's maximum {max_ctx}")
            if min(blocks) < 0 or max(blocks) >= nblk:
                raise ValueError(f"sequence {i}: block ids outside [0, {nblk})")
            if check:
                for j in range(n):
                    p = p0 + j
                    if b[j] != blocks[p // t_m] or o[j] != p % t_m:
                        raise ValueError(
                            f"sequence {i}: slot {j} is ({b[j]}, {o[j]}) but position {p} lives at "
                            f"({blocks[p // t_m]}, {p % t_m}) in its block table"
                        )
            cols.append((t, blocks, b, o, p0))
            (decodes if n == 1 else others).append(i)
        order = decodes + others
        nd = len(decodes)
        dec = [cols[i] for i in decodes]
        # decodes: one token each, rows [0, nd)
        ids = [c[0][0] for c in dec]
        pos = [c[4] for c in dec]
        sb = [c[2][0] for c in dec]
        so = [c[3][0] for c in dec]
        start = list(pos)
        q_len = [1] * nd
        tok_off = list(range(nd))
        table: list[int] = []
        tbl_off = []
        for c in dec:
            tbl_off.append(len(table))
            table += c[1]
        for i in others:
            t, blocks, b, o, p0 = cols[i]
            q_len.append(len(t))
            start.append(p0)
            tok_off.append(len(ids))
            tbl_off.append(len(table))
            ids += t
            pos += range(p0, p0 + len(t))
            sb += b
            so += o
            table += blocks
        layout = BatchLayout(q_len, start, tok_off, tbl_off, nd, table, t_m)
        return layout, order, ids + pos + sb + so

    def _run(self, seqs: Sequence[SeqStep], all_positions: bool) -> Any:
        if not seqs:
            raise ValueError("forward needs at least one sequence")
        layout, order, flat = self._layout(seqs)
        if self.lora is None:
            return self._forward(layout, order, flat, all_positions)
        self.lora.step_mask(self._token_adapters(seqs, order))
        try:
            return self._forward(layout, order, flat, all_positions)
        finally:
            self.lora.step_mask(None)

    @torch.inference_mode()
    def _forward(self, layout: BatchLayout, order: list[int], flat: list[int], all_positions: bool) -> Any:
        total = len(flat) // 4
        internal = [0] * len(order)  # caller's index -> row in the decode-first layout
        for j, i in enumerate(order):
            internal[i] = j
        pack = Packer()
        at_flat = pack.add(flat)
        plans = {w: build_plan(layout, w, pack, self.device) for w in self._window_set}
        last = [layout.tok_off[j] + layout.q_len[j] - 1 for j in internal]
        at_last = None if all_positions or last == list(range(total)) else pack.add(last)
        packed = pack.tensors(self.device)
        for plan in plans.values():
            plan.bind(packed, self.device)
        ids, pos, sb, so = packed[at_flat].view(4, total)
        h = self._embed(ids)  # [T, hidden]
        cos, sin = self._cos_sin(h, pos, max(layout.start[j] + layout.q_len[j] for j in range(len(order))))
        cos, sin = cos[:, None], sin[:, None]  # [T, 1, D]: broadcast over heads
        half = cos.shape[-1] // 2
        d = self.shape.head_dim
        direct = self._direct
        for li, layer in enumerate(self._layers):
            if direct is not None:
                dl = direct[li]
                x = dl.ln1(h)
                q = F.linear(x, *dl.q).view(total, -1, d)
                k = F.linear(x, *dl.k).view(total, -1, d)
                v = F.linear(x, *dl.v).view(total, -1, d)
            else:
                attn = layer.self_attn
                x = layer.input_layernorm(h)
                q = attn.q_proj(x).view(total, -1, d)
                k = attn.k_proj(x).view(total, -1, d)
                v = attn.v_proj(x).view(total, -1, d)
            q = q * cos + q.roll(half, -1) * sin  # HF's x·cos + rotate_half(x)·sin, bitwise
            k = k * cos + k.roll(half, -1) * sin
            o = paged_attention(
                self._layer_slots[li],
                self._layer_blocks[li],
                q,
                k,
                v,
                sb,
                so,
                plans[self.windows[li]],
                self._scales[li],
            )
            if direct is not None:
                h = h + F.linear(o.reshape(total, -1), *dl.o)
                y = dl.ln2(h)
                h = h + F.linear(dl.act(F.linear(y, *dl.gate)) * F.linear(y, *dl.up), *dl.down)
            else:
                h = h + attn.o_proj(o.reshape(total, -1))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        norm = self._final_norm
        if all_positions:
            logits = self._lm_head(norm(h)).float()
            return [logits[layout.tok_off[j] : layout.tok_off[j] + layout.q_len[j]] for j in internal]
        rows = h if at_last is None else h.index_select(0, packed[at_last])
        return self._lm_head(norm(rows)).float()
