"""LoRA adapters on the native runner: greedy output equals HF ``generate`` on the base with the adapter
merged (``merge_and_unload``), and one batch mixing three adapters and the base gives each row its own
output. The base is a tiny random llama saved as a checkpoint; the adapters are random PEFT adapters
(``init_lora_weights=False``: B is not zero) saved in PEFT's format, so the engine reads real files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from llmfleet.kvblocks.storage import KvStorage
from llmfleet_engine.lora import AdapterError, AdapterPool, load_adapter
from llmfleet_engine.models import tiny_config
from llmfleet_engine.native import PagedRunner, SeqStep
from lora_checkpoints import ADAPTERS, cut_at_eos, fresh_base, hf_greedy, merged, save_checkpoints
from peft import LoraConfig
from transformers import AutoModelForCausalLM, LlamaConfig

N_NEW = 12
MAX_RANK = 8
PROMPTS = [[0, 17, 42, 99, 5, 23], [0, 8, 8, 300, 12], [0, 250, 3, 77, 61, 9, 140], [0, 33, 34, 35]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, Path]]:
    return save_checkpoints(tmp_path_factory.mktemp("lora"), cache_dir)


class Seq:
    """One sequence's blocks in a storage whose blocks are handed out from ``free``."""

    def __init__(self, free: list[int], t_m: int, adapter: int) -> None:
        self.free, self.t_m, self.adapter = free, t_m, adapter
        self.table: list[int] = []
        self.length = 0

    def step(self, token_ids: Sequence[int]) -> SeqStep:
        start, end = self.length, self.length + len(token_ids)
        while len(self.table) * self.t_m < end:
            self.table.append(self.free.pop())
        self.length = end
        pos = range(start, end)
        slots_block = [self.table[p // self.t_m] for p in pos]
        slots_offset = [p % self.t_m for p in pos]
        return SeqStep(list(token_ids), start, list(self.table), slots_block, slots_offset, self.adapter)


def batch_greedy(
    runner: PagedRunner, prompts: Sequence[Sequence[int]], adapters: Sequence[int]
) -> list[list[int]]:
    """All prompts prefilled in one forward, then N_NEW - 1 decode forwards of the whole batch; each
    row's tokens cut before its first EOS."""
    free = list(range(runner.storage.num_blocks))
    seqs = [Seq(free, runner.tokens_per_block, a) for a in adapters]
    logits = runner.forward([s.step(p) for s, p in zip(seqs, prompts, strict=True)])
    outs = [[int(t)] for t in logits.argmax(-1)]
    for _ in range(N_NEW - 1):
        logits = runner.forward([s.step(o[-1:]) for s, o in zip(seqs, outs, strict=True)])
        for o, t in zip(outs, logits.argmax(-1), strict=True):
            o.append(int(t))
    eos = frozenset({runner.model.generation_config.eos_token_id})
    return [cut_at_eos(o, eos) for o in outs]


@pytest.fixture(scope="module")
def engine(checkpoints) -> tuple[PagedRunner, AdapterPool, dict[str, int]]:
    base_dir, dirs = checkpoints
    model = fresh_base(base_dir)
    pool = AdapterPool.attach(model, max_adapters=4, max_rank=MAX_RANK)
    slots = {}
    for slot, (name, d) in enumerate(dirs.items()):
        pool.load(load_adapter(name, d, model, max_rank=MAX_RANK, targets=pool.targets), slot)
        slots[name] = slot
    return PagedRunner(model, KvStorage(64, 2048), "tiny-llama-base", lora=pool), pool, slots


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_equals_merged_generate(checkpoints, engine, name: str) -> None:
    base_dir, dirs = checkpoints
    runner, _, slots = engine
    want = hf_greedy(merged(base_dir, dirs[name]), PROMPTS[0], N_NEW)
    assert batch_greedy(runner, [PROMPTS[0]], [slots[name]]) == [want]
    assert want != hf_greedy(fresh_base(base_dir), PROMPTS[0], N_NEW)  # the adapter changes the output


def test_mixed_batch_gives_each_row_its_own_output(checkpoints, engine) -> None:
    base_dir, dirs = checkpoints
    runner, _, slots = engine
    names = ["qv", None, "all", "mlp"]
    want = [
        hf_greedy(fresh_base(base_dir) if n is None else merged(base_dir, dirs[n]), p, N_NEW)
        for n, p in zip(names, PROMPTS, strict=True)
    ]
    got = batch_greedy(runner, PROMPTS, [-1 if n is None else slots[n] for n in names])
    assert got == want
    # the same prompt under each adapter and the base: four different outputs in one batch
    same = batch_greedy(runner, [PROMPTS[1]] * 4, [slots["qv"], -1, slots["all"], slots["mlp"]])
    assert len({tuple(o) for o in same}) == 4


def test_a_load_replaces_what_its_slot_held(checkpoints) -> None:
    base_dir, dirs = checkpoints
    model = fresh_base(base_dir)
    pool = AdapterPool.attach(model, max_adapters=1, max_rank=MAX_RANK)
    runner = PagedRunner(model, KvStorage(64, 2048), "tiny-llama-base", lora=pool)
    read = {n: load_adapter(n, d, model, max_rank=MAX_RANK, targets=pool.targets) for n, d in dirs.items()}
    for name in ["all", "mlp"]:  # rank 8 on every Linear, then rank 2 on three: nothing of "all" stays
        pool.load(read[name], 0)
        assert batch_greedy(runner, [PROMPTS[0]], [0]) == [
            hf_greedy(merged(base_dir, dirs[name]), PROMPTS[0], N_NEW)
        ]


def test_bad_adapters_are_refused_naming_the_problem(checkpoints, tmp_path: Path) -> None:
    base_dir, dirs = checkpoints
    model = fresh_base(base_dir)
    pool = AdapterPool.attach(model, max_adapters=2, max_rank=MAX_RANK)
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors is missing"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "adapter_config.json").write_text(
            json.dumps(LoraConfig(r=4).to_dict(), default=list)
        )
        load_adapter("empty", tmp_path / "empty", model, max_rank=MAX_RANK, targets=pool.targets)
    with pytest.raises(AdapterError, match=r"rank 8 .* exceeds the engine.s max rank 4"):
        load_adapter("all", dirs["all"], model, max_rank=4, targets=pool.targets)
    wider = AutoModelForCausalLM.from_config(
        LlamaConfig(**{**tiny_config("llama").to_dict(), "hidden_size": 128})
    )
    with pytest.raises(AdapterError, match=r"the base.s Linear is 128 -> 64.*another base"):
        load_adapter("qv", dirs["qv"], wider, max_rank=MAX_RANK, targets=pool.targets)
    with pytest.raises(AdapterError, match="the engine's LoRA targets are"):
        load_adapter("all", dirs["all"], model, max_rank=MAX_RANK, targets=frozenset({"q_proj", "v_proj"}))
