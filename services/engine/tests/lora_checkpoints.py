"""Test checkpoints for LoRA: a tiny random llama saved with the tiny tokenizer, and random PEFT
adapters of it (``init_lora_weights=False``: B is not zero) saved in PEFT's format."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from llmfleet_engine.models import materialize, tiny_config
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (rank, alpha, targets, rsLoRA)
ADAPTERS = {
    "qv": (4, 8, ["q_proj", "v_proj"], False),
    "all": (8, 16, ALL_LINEAR, False),
    "mlp": (2, 4, ["up_proj", "down_proj", "o_proj"], True),
}


def fresh_base(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def merged(base_dir: Path, adapter_dir: Path) -> torch.nn.Module:
    """The base with the adapter merged into its weights (PEFT's ``merge_and_unload``)."""
    return PeftModel.from_pretrained(fresh_base(base_dir), adapter_dir).merge_and_unload().eval()


def save_checkpoints(root: Path, cache_dir: Path) -> tuple[Path, dict[str, Path]]:
    """The base checkpoint (with the tiny tokenizer's files) and one directory per ``ADAPTERS`` entry."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        base = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.float32)
        base.save_pretrained(root / "base")
        for f in Path(materialize("tiny://llama", cache_dir)).glob("*token*"):
            shutil.copy(f, root / "base" / f.name)
        dirs = {}
        for i, (name, (r, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
            torch.manual_seed(100 + i)
            cfg = LoraConfig(
                r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, init_lora_weights=False
            )
            get_peft_model(fresh_base(root / "base"), cfg).save_pretrained(root / name)
            dirs[name] = root / name
    return root / "base", dirs


def cut_at_eos(ids: list[int], eos: frozenset[int]) -> list[int]:
    cut = [i for i, t in enumerate(ids) if t in eos]
    return ids[: cut[0]] if cut else ids


def hf_greedy(model: torch.nn.Module, prompt_ids: Sequence[int], n: int) -> list[int]:
    """HF ``generate``'s greedy continuation of at most ``n`` tokens, cut before the first EOS."""
    ids = torch.tensor([list(prompt_ids)])
    gen = model.generation_config
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=gen.pad_token_id,
        )
    return cut_at_eos(out[0, len(prompt_ids) :].tolist(), frozenset({gen.eos_token_id}))
