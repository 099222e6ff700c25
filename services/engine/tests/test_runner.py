"""PagedRunner correctness: HF logits and greedy tokens, mixed batches, a shared pool, KV export/import."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest
import torch
from llmfleet.kvblocks.storage import KvStorage
from llmfleet_engine.models import LoadedModel, load_model, tiny_config
from llmfleet_engine.native import PagedRunner, SeqStep, UnsupportedModelError, kv_shape_of
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Qwen2Config

# llama 512 B/token -> T=4 (2048 of 2304 bytes used), qwen2 1152 -> T=2, mistral 1024 -> T=2
BLOCK_BYTES = 2304
ARCHS = ["llama", "qwen2", "mistral"]
N_NEW = 32


class Blocks:
    """Test-side block bookkeeping: a shuffled free list shared by every sequence of one storage."""

    def __init__(self, storage: KvStorage, seed: int = 0) -> None:
        self.free = list(range(storage.num_blocks))
        random.Random(seed).shuffle(self.free)


class Seq:
    """One sequence's block table; ``step(tokens)`` allocates their slots and returns the SeqStep."""

    def __init__(self, blocks: Blocks, tokens_per_block: int) -> None:
        self.pool, self.t_m = blocks, tokens_per_block
        self.table: list[int] = []
        self.length = 0

    def step(self, token_ids: Sequence[int]) -> SeqStep:
        start, end = self.length, self.length + len(token_ids)
        while len(self.table) * self.t_m < end:
            self.table.append(self.pool.free.pop())
        pos = range(start, end)
        self.length = end
        return SeqStep(
            list(token_ids),
            start,
            list(self.table),
            [self.table[p // self.t_m] for p in pos],
            [p % self.t_m for p in pos],
        )


@pytest.fixture(params=ARCHS)
def arch_model(request, llama, qwen2, mistral) -> LoadedModel:
    return {"llama": llama, "qwen2": qwen2, "mistral": mistral}[request.param]


@pytest.fixture(scope="module")
def windowed() -> LoadedModel:
    """Tiny mistral with a 5-token sliding window (applied in the mask by both HF and the runner)."""
    config = tiny_config("mistral")
    config.sliding_window = 5
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return LoadedModel(
        name="tiny-mistral-w5",
        source="test",
        model=model,
        tokenizer=None,
        architecture="MistralForCausalLM",
        dtype="float32",
        device="cpu",
        weight_bytes=0,
        max_context=2048,
        kv_bytes_per_token=0,
        eos_token_ids=frozenset(),
        vocab_size=config.vocab_size,
    )


@pytest.fixture(scope="module")
def long_prompt(long_prompt):
    """The conftest's ``long_prompt``, memoised (each call runs several HF generations)."""
    cache: dict = {}

    def cached(model: LoadedModel, n: int, skip: int = 0) -> str:
        key = (model.name, n, skip)
        if key not in cache:
            cache[key] = long_prompt(model, n, skip)
        return cache[key]

    return cached


def ids_of(model: LoadedModel, text: str) -> list[int]:
    return model.tokenizer(text)["input_ids"]


def hf_logits(model: LoadedModel, ids: Sequence[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.model(torch.tensor([list(ids)])).logits[0].float()


def runner_greedy(runner: PagedRunner, seq: Seq, prompt: Sequence[int], n: int, chunk: int = 0) -> list[int]:
    """Prefill (in chunks of ``chunk`` tokens if set), then n-1 one-token decode steps."""
    chunks = [prompt[i : i + chunk] for i in range(0, len(prompt), chunk)] if chunk else [prompt]
    for c in chunks:
        logits = runner.forward([seq.step(c)])
    out = [int(logits[0].argmax())]
    while len(out) < n:
        out.append(int(runner.forward([seq.step(out[-1:])])[0].argmax()))
    return out


def cut_at_eos(model: LoadedModel, tokens: list[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in model.eos_token_ids:
            return tokens[:i]
    return tokens


def new_runner(
    model: LoadedModel,
    num_blocks: int = 64,
    block_bytes: int = BLOCK_BYTES,
    name: str = "m",
    direct: bool = True,
):
    storage = KvStorage(num_blocks, block_bytes)
    runner = PagedRunner(model.model, storage, name, direct=direct)
    return runner, Blocks(storage)


# ------------------------------------------------------------------------------------------ basics
def test_kv_shape_and_registration(arch_model):
    runner, _ = new_runner(arch_model)
    shape = kv_shape_of(arch_model.model.config, torch.float32)
    assert shape.bytes_per_token == arch_model.kv_bytes_per_token
    assert runner.shape == shape and runner.storage.shape("m") == shape
    assert runner.tokens_per_block == BLOCK_BYTES // shape.bytes_per_token
    runner.close()
    assert "m" not in runner.storage


def test_rejects_other_architectures():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        PagedRunner(gpt2, KvStorage(4, 1024), "gpt2")


# --------------------------------------------------------------------------------- logits vs HF
def test_prefill_logits_match_hf(arch_model, prompts):
    runner, blocks = new_runner(arch_model)
    ids = ids_of(arch_model, prompts[1] + " " + prompts[7])
    ref = hf_logits(arch_model, ids)
    out = runner.forward_all([Seq(blocks, runner.tokens_per_block).step(ids)])[0]
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-5)
    last = runner.forward([Seq(blocks, runner.tokens_per_block).step(ids)])
    assert last.shape == (1, arch_model.vocab_size) and last.dtype == torch.float32
    torch.testing.assert_close(last[0], ref[-1], atol=1e-4, rtol=1e-5)


def test_chunked_prefill_logits_match_hf(arch_model, prompts):
    runner, blocks = new_runner(arch_model)
    ids = ids_of(arch_model, prompts[1])
    seq = Seq(blocks, runner.tokens_per_block)
    out = [runner.forward_all([seq.step(ids[a:b])])[0] for a, b in [(0, 5), (5, 6), (6, 13), (13, len(ids))]]
    torch.testing.assert_close(torch.cat(out), hf_logits(arch_model, ids), atol=1e-4, rtol=1e-5)


# ------------------------------------------------------------------------------- greedy vs HF
def test_greedy_decode_matches_hf_generate(arch_model, prompts, hf_greedy, long_prompt):
    runner, blocks = new_runner(arch_model, num_blocks=256)
    full = 0
    for text in [long_prompt(arch_model, N_NEW), prompts[4]]:
        ids = ids_of(arch_model, text)
        ref = hf_greedy(arch_model, ids, N_NEW)
        got = cut_at_eos(arch_model, runner_greedy(runner, Seq(blocks, runner.tokens_per_block), ids, N_NEW))
        assert got == ref, text
        full += len(got) == N_NEW
    assert full >= 1  # at least one comparison ran all 32 tokens


def test_greedy_with_chunked_prefill_and_one_token_blocks(llama, prompts, hf_greedy, long_prompt):
    runner, blocks = new_runner(llama, num_blocks=128, block_bytes=512)  # T_m = 1
    assert runner.tokens_per_block == 1
    ids = ids_of(llama, long_prompt(llama, N_NEW))
    got = runner_greedy(runner, Seq(blocks, 1), ids, N_NEW, chunk=3)
    assert got == hf_greedy(llama, ids, N_NEW)


# ---------------------------------------------------------------------------------- mixed batch
def test_mixed_batch_equals_separate_runs_and_hf(arch_model, prompts):
    ids = ids_of(arch_model, prompts[1] + " " + prompts[2])
    assert len(ids) >= 14
    a_ids, b_ids, c_ids, d_ids = ids[:7], ids[1:14], ids[3:14], ids[5:8]

    def prepare(runner, blocks):
        t = runner.tokens_per_block
        seqs = {k: Seq(blocks, t) for k in "ABCD"}
        runner.forward([seqs["B"].step(b_ids[:12]), seqs["D"].step(d_ids[:2])])
        runner.forward([seqs["C"].step(c_ids[:5])])
        steps = [
            seqs["D"].step(d_ids[2:]),  # decode, context 3
            seqs["A"].step(a_ids),  # prefill of 7
            seqs["B"].step(b_ids[12:]),  # decode, context 13
            seqs["C"].step(c_ids[5:]),  # chunk of 6 at start_pos 5
        ]
        return steps

    runner, blocks = new_runner(arch_model)
    runner.storage.pool.fill_(0xFF)  # NaN everywhere not written by the sequences
    steps = prepare(runner, blocks)
    mixed_last = runner.forward(steps)
    mixed_all = runner.forward_all(steps)  # rewriting the same slots with the same values is idempotent

    runner2, blocks2 = new_runner(arch_model)
    separate = [runner2.forward_all([s])[0] for s in prepare(runner2, blocks2)]

    refs = [
        hf_logits(arch_model, d_ids)[2:],
        hf_logits(arch_model, a_ids),
        hf_logits(arch_model, b_ids)[12:],
        hf_logits(arch_model, c_ids)[5:],
    ]
    assert mixed_last.shape == (4, arch_model.vocab_size)
    for i in range(4):
        assert mixed_all[i].shape == refs[i].shape
        torch.testing.assert_close(mixed_all[i], separate[i], atol=5e-5, rtol=1e-5)
        torch.testing.assert_close(mixed_all[i], refs[i], atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(mixed_last[i], refs[i][-1], atol=1e-4, rtol=1e-5)


def test_batched_greedy_decoding_of_many_sequences(llama, prompts, hf_greedy):
    runner, blocks = new_runner(llama, num_blocks=512)
    runner.storage.pool.fill_(0xFF)  # unwritten slots read as NaN: they must never reach the math
    ids = [ids_of(llama, p) for p in prompts]
    seqs = [Seq(blocks, runner.tokens_per_block) for _ in ids]
    logits = runner.forward([s.step(p) for s, p in zip(seqs, ids, strict=True)])
    outs = [[int(t)] for t in logits.argmax(-1)]
    for _ in range(15):
        logits = runner.forward([s.step(o[-1:]) for s, o in zip(seqs, outs, strict=True)])
        for o, t in zip(outs, logits.argmax(-1).tolist(), strict=True):
            o.append(t)
    for p, o in zip(ids, outs, strict=True):
        assert cut_at_eos(llama, o) == hf_greedy(llama, p, 16)


def test_direct_layers_equal_the_modules_bitwise(arch_model, prompts):
    """The direct path (weights called with F.linear, fp32 RMSNorm as F.rms_norm, RoPE by roll) gives
    bitwise the logits of calling the HF modules; equal-length prompts (one batched SDPA call) agree
    with separate runs."""
    ids = ids_of(arch_model, prompts[1] + " " + prompts[2])
    a_ids, b_ids, c_ids = ids[:6], ids[1:7], ids[2:8]  # three prompts of 6 tokens: one batched SDPA call

    def run(direct: bool, together: bool) -> list[torch.Tensor]:
        runner, blocks = new_runner(arch_model, direct=direct)
        assert runner.direct == direct  # CPU, plain modules: the direct path applies
        seqs = [Seq(blocks, runner.tokens_per_block) for _ in range(3)]
        prompts_ = (a_ids, b_ids, c_ids)
        if together:
            out = runner.forward_all([s.step(p) for s, p in zip(seqs, prompts_, strict=True)])
        else:
            out = [runner.forward_all([s.step(p)])[0] for s, p in zip(seqs, prompts_, strict=True)]
        decode = runner.forward([s.step([int(o[-1].argmax())]) for s, o in zip(seqs, out, strict=True)])
        return [*out, decode]

    for together in (False, True):
        for got, want in zip(run(True, together), run(False, together), strict=True):
            assert torch.equal(got, want), together
    # batched prompts vs one at a time: GEMMs of other row counts round differently, within tolerance
    for got, want in zip(run(True, True), run(True, False), strict=True):
        torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-5)


def test_rope_table_grows_with_the_positions(llama, prompts):
    runner, blocks = new_runner(llama, num_blocks=256)
    t = runner.tokens_per_block
    short = ids_of(llama, prompts[0])
    out = runner.forward_all([Seq(blocks, t).step(short)])[0]
    torch.testing.assert_close(out, hf_logits(llama, short), atol=1e-4, rtol=1e-5)
    small = runner.rope_positions
    long_ids = ids_of(llama, " ".join(prompts * 4))[:300]
    assert len(long_ids) == 300 > small
    out = runner.forward_all([Seq(blocks, t).step(long_ids)])[0]
    torch.testing.assert_close(out, hf_logits(llama, long_ids), atol=1e-4, rtol=1e-5)
    assert runner.rope_positions > len(long_ids)


# ----------------------------------------------------------------------------- shared storage
def test_two_models_share_one_storage(llama, qwen2, hf_greedy, long_prompt):
    storage = KvStorage(128, BLOCK_BYTES)
    r_llama = PagedRunner(llama.model, storage, "llama")
    r_qwen = PagedRunner(qwen2.model, storage, "qwen2")
    assert r_llama.tokens_per_block != r_qwen.tokens_per_block
    blocks = Blocks(storage, seed=3)
    jobs = []
    for runner, model in [(r_llama, llama), (r_qwen, qwen2)]:
        ids = ids_of(model, long_prompt(model, N_NEW))
        jobs.append((runner, Seq(blocks, runner.tokens_per_block), ids, hf_greedy(model, ids, N_NEW), []))
    for step in range(N_NEW):  # interleaved, blocks of both models intermixed in one pool
        for runner, seq, ids, _, out in jobs:
            logits = runner.forward([seq.step(ids if step == 0 else out[-1:])])
            out.append(int(logits[0].argmax()))
    owners = [set(seq.table) for _, seq, *_ in jobs]
    assert not owners[0] & owners[1]
    for *_, ref, out in jobs:
        assert out == ref


def test_half_precision_models_share_a_nan_filled_pool(cache_dir, hf_greedy, long_prompt, llama, qwen2):
    """bf16 llama + fp16 qwen2 in one pool whose unwritten bytes read as NaN: HF's greedy tokens."""
    storage = KvStorage(128, BLOCK_BYTES)
    storage.pool.fill_(0xFF)
    blocks = Blocks(storage, seed=5)
    for base, dtype in [(llama, "bfloat16"), (qwen2, "float16")]:
        model = load_model(
            dataclasses.replace(base.spec, dtype=dtype), cache_dir=cache_dir, allow_download=False
        )
        runner = PagedRunner(model.model, storage, dtype)
        ids = ids_of(model, long_prompt(base, N_NEW))
        prompts_ = [ids, ids[:-3]]  # two lengths: a padded decode group
        seqs = [Seq(blocks, runner.tokens_per_block) for _ in prompts_]
        logits = runner.forward([s.step(p) for s, p in zip(seqs, prompts_, strict=True)])
        outs = [[t] for t in logits.argmax(-1).tolist()]
        for _ in range(15):
            logits = runner.forward([s.step(o[-1:]) for s, o in zip(seqs, outs, strict=True)])
            for o, t in zip(outs, logits.argmax(-1).tolist(), strict=True):
                o.append(t)
        for p, o in zip(prompts_, outs, strict=True):
            assert cut_at_eos(model, o) == hf_greedy(model, p, 16), dtype


# ------------------------------------------------------------------------------ export / import
def test_export_import_to_other_block_size_continues_identically(qwen2, hf_greedy, long_prompt):
    ids = ids_of(qwen2, long_prompt(qwen2, N_NEW))
    ref = hf_greedy(qwen2, ids, N_NEW)
    src, src_blocks = new_runner(qwen2, block_bytes=BLOCK_BYTES, name="src")  # T = 2
    seq = Seq(src_blocks, src.tokens_per_block)
    first = runner_greedy(src, seq, ids, 10)
    # the KV of prompt + 9 decoded tokens (the 10th token is not in the KV yet)
    n = seq.length
    chunks = [(a, src.storage.export_tokens("src", seq.table, a, min(a + 7, n))) for a in range(0, n, 7)]

    dst, dst_blocks = new_runner(qwen2, num_blocks=32, block_bytes=8192, name="dst")  # T = 7
    assert dst.tokens_per_block == 7
    moved = Seq(dst_blocks, dst.tokens_per_block)
    moved.step([0] * n)  # allocate the table for n tokens (the dummy ids are never run)
    for a, data in reversed(chunks):  # in another order than exported
        dst.storage.import_tokens("dst", moved.table, a, data)
    for layer in range(dst.shape.num_layers):
        src_kv = src.storage.gather("src", layer, seq.table, n)
        dst_kv = dst.storage.gather("dst", layer, moved.table, n)
        assert all(torch.equal(a, b) for a, b in zip(src_kv, dst_kv, strict=True))
    out = list(first)
    while len(out) < N_NEW:
        out.append(int(dst.forward([moved.step(out[-1:])])[0].argmax()))
    assert out == ref


def test_runner_names_are_storage_registrations(llama, qwen2):
    storage = KvStorage(8, BLOCK_BYTES)
    PagedRunner(qwen2.model, storage, "x")
    with pytest.raises(ValueError, match="already registered"):
        PagedRunner(llama.model, storage, "x")


# ------------------------------------------------------------------------------- sliding window
def test_sliding_window_prefill_chunks_and_decode_match_hf(windowed):
    runner, blocks = new_runner(windowed)
    assert runner.windows == [5, 5]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, windowed.vocab_size, (17,), generator=gen).tolist()
    ref = hf_logits(windowed, ids)
    out = runner.forward_all([Seq(blocks, runner.tokens_per_block).step(ids)])[0]
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-5)
    seq = Seq(blocks, runner.tokens_per_block)
    parts = [runner.forward_all([seq.step(ids[a:b])])[0] for a, b in [(0, 3), (3, 11), (11, 12), (12, 17)]]
    torch.testing.assert_close(torch.cat(parts), ref, atol=1e-4, rtol=1e-5)
    # greedy continuation of two sequences decoding in one batch (padded decode group), each step
    # checked against a full HF forward (no cache involved)
    runner.storage.pool.fill_(0xFF)
    fulls = [list(ids), list(ids[:3])]
    seqs = [Seq(blocks, runner.tokens_per_block) for _ in fulls]
    logits = runner.forward([s.step(f) for s, f in zip(seqs, fulls, strict=True)])
    for _ in range(10):
        for row, full in zip(logits, fulls, strict=True):
            torch.testing.assert_close(row, hf_logits(windowed, full)[-1], atol=1e-4, rtol=1e-5)
            full.append(int(row.argmax()))
        logits = runner.forward([s.step(f[-1:]) for s, f in zip(seqs, fulls, strict=True)])


def test_qwen2_sliding_layers_match_hf():
    """Qwen2 with ``use_sliding_window``: layer 0 full attention, layers 1-2 a 4-token window."""
    d = tiny_config("qwen2").to_dict()
    d.update(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    d.pop("layer_types", None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**d), dtype=torch.float32).eval()
    runner = PagedRunner(model, KvStorage(32, BLOCK_BYTES), "q")
    assert runner.windows == [None, 4, 4]
    blocks = Blocks(runner.storage)
    ids = torch.randint(3, d["vocab_size"], (13,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    seq = Seq(blocks, runner.tokens_per_block)
    parts = [runner.forward_all([seq.step(ids[a:b])])[0] for a, b in [(0, 6), (6, 7), (7, 13)]]
    torch.testing.assert_close(torch.cat(parts), ref, atol=1e-4, rtol=1e-5)


def test_sliding_window_greedy_matches_hf_generate(windowed):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, windowed.vocab_size, (9,), generator=gen).tolist()
    with torch.inference_mode():
        ref = windowed.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, 9, dtype=torch.long),
            do_sample=False,
            max_new_tokens=20,
            eos_token_id=None,
            pad_token_id=0,
        )[0, 9:].tolist()
    runner, blocks = new_runner(windowed)
    assert runner_greedy(runner, Seq(blocks, runner.tokens_per_block), ids, len(ref)) == ref


# ---------------------------------------------------------------------------------- validation
def test_rejects_inconsistent_steps(llama):
    runner, _ = new_runner(llama, num_blocks=8)
    t = runner.tokens_per_block
    with pytest.raises(ValueError, match="at least one"):
        runner.forward([])
    with pytest.raises(ValueError, match="needs new tokens"):
        runner.forward([SeqStep([], 0, [0], [], [])])
    with pytest.raises(ValueError, match="does not fit"):
        runner.forward([SeqStep([5] * (t + 1), 0, [0], [0] * (t + 1), list(range(t + 1)))])
    with pytest.raises(ValueError, match="1 slot blocks"):
        runner.forward([SeqStep([5, 6], 0, [0], [0], [0])])
    with pytest.raises(ValueError, match="lives at"):
        runner.forward([SeqStep([5, 6], 0, [0], [0, 0], [1, 0])])
    with pytest.raises(ValueError, match="block ids"):
        runner.forward([SeqStep([5], 0, [8], [8], [0])])
    with pytest.raises(ValueError, match="exceeds"):
        runner.forward([SeqStep([5], 2048, list(range(8)) * 65, [0], [0])])
