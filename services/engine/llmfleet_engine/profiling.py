"""Timed sweeps for resource characterization: raw measurements, no fitting (the profiler fits).

Prefill: ``b`` sequences of ``n`` new tokens in one forward, for every (b, n). Decode: ``b`` sequences
holding ``c`` tokens of context (prefilled untimed) each decode one token in one forward, for every
(b, c). Each point runs one warm-up and ``repeats`` timed iterations on the worker thread, so it
never overlaps serving iterations; the temporary sequences live in the real pool and are freed
after each point. Points that do not fit the free pool are skipped and reported as such.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from llmfleet.kvblocks import BlockAllocator, OutOfBlocks

from llmfleet_engine.native.runner import SeqStep
from llmfleet_engine.outputs import ResourceExhaustedError

if TYPE_CHECKING:
    from llmfleet_engine.models import LoadedModel
    from llmfleet_engine.native.runner import PagedRunner


class PagedModels(Protocol):
    """The native executor's models (``model_host.ModelHost``) as a sweep reads them."""

    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def model_names(self) -> tuple[str, ...]: ...

    def runner(self, model: str) -> PagedRunner: ...


class Executor(Protocol):
    """What a sweep uses of the native executor (which calls :func:`profile`)."""

    device: str

    @property
    def host(self) -> PagedModels: ...

    def with_pool(self, fn: Callable[[BlockAllocator], T]) -> T: ...

    def run_in_worker(self, job: Callable[[], Any], timeout_s: float | None = None) -> Any: ...


log = logging.getLogger(__name__)
T = TypeVar("T")
# one point of a sweep: (phase, batch, tokens, repeats) -> the repeats' seconds; OutOfBlocks: skip it
PointTimer = Callable[[str, int, int, int], list[float]]

PREFIX = "__profile__/"
MAX_PROFILE_BATCH = 4096  # sequences per point
MAX_PROFILE_REPEATS = 100  # timed iterations per point
MAX_SWEEP_VALUES = 32  # values per sweep list (batch sizes, input lengths, context lengths)


@dataclass(frozen=True)
class ProfileSample:
    phase: str  # "prefill" | "decode"
    batch_size: int
    tokens: int  # input length (prefill) or context length (decode) per sequence
    seconds: float


@dataclass(frozen=True)
class ProfileResult:
    samples: tuple[ProfileSample, ...]
    skipped: tuple[tuple[str, int, int], ...]  # (phase, batch, tokens) that did not fit


def profile(
    ex: Executor,
    model: str,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    input_lengths: Sequence[int] = (16, 64, 256),
    context_lengths: Sequence[int] = (16, 64, 256),
    repeats: int = 3,
    point: PointTimer | None = None,
) -> ProfileResult:
    """Run the sweeps on the worker thread (blocking; raises KeyError for an unknown model, ValueError
    for bad sizes). ``point`` times one point (default: timed forwards of the paged runner)."""
    if model not in ex.host.model_names():
        raise KeyError(model)
    max_context = ex.host.models[model].max_context
    check_sweep(max_context, batch_sizes, input_lengths, context_lengths, repeats)
    timer = point or _forward_timer(ex, model)
    return ex.run_in_worker(
        lambda: _sweep(model, timer, batch_sizes, input_lengths, context_lengths, repeats)
    )


def check_sweep(
    max_context: int,
    batch_sizes: Sequence[int],
    input_lengths: Sequence[int],
    context_lengths: Sequence[int],
    repeats: int,
) -> None:
    """Raise ValueError, naming the ProfileRequest field, for a sweep that is invalid or unbounded (a
    huge batch would build that many sequences before the KV pool refuses them; huge repeats or
    hundreds of points would hold the worker for hours)."""
    for name, values, limit in (
        ("batch_sizes", batch_sizes, MAX_PROFILE_BATCH),
        ("input_lengths", input_lengths, max_context - 1),
        ("context_lengths", context_lengths, max_context - 1),
    ):
        if len(values) > MAX_SWEEP_VALUES:
            raise ValueError(f"{name}: at most {MAX_SWEEP_VALUES} values, got {len(values)}")
        if any(x <= 0 for x in values):
            raise ValueError(f"{name}: every value must be positive, got {list(values)}")
        if any(x > limit for x in values):
            what = "the model's context" if name != "batch_sizes" else "the largest profiled batch"
            raise ValueError(f"{name}: every value must be at most {limit} ({what}), got {max(values)}")
    if not 0 < repeats <= MAX_PROFILE_REPEATS:
        raise ValueError(f"repeats: must be in [1, {MAX_PROFILE_REPEATS}], got {repeats}")


def _forward_timer(ex: Executor, model: str) -> PointTimer:
    runner = ex.host.runner(model)
    vocab = ex.host.models[model].vocab_size
    gen = torch.Generator().manual_seed(0)

    def timer(phase: str, b: int, n: int, repeats: int) -> list[float]:
        with torch.inference_mode():
            return _point(ex, runner, model, vocab, gen, phase, b, n, repeats)

    return timer


def _sweep(
    model: str, point: PointTimer, batch_sizes, input_lengths, context_lengths, repeats
) -> ProfileResult:
    samples: list[ProfileSample] = []
    skipped: list[tuple[str, int, int]] = []
    for phase, lengths in (("prefill", input_lengths), ("decode", context_lengths)):
        for b in batch_sizes:
            for n in lengths:
                try:
                    seconds = point(phase, b, n, repeats)
                except OutOfBlocks:
                    skipped.append((phase, b, n))
                    continue
                samples.extend(ProfileSample(phase, b, n, s) for s in seconds)
    if not samples:
        raise ResourceExhaustedError(
            f"no profiling point fits the free KV pool of {model!r}; skipped {skipped}"
        )
    return ProfileResult(tuple(samples), tuple(skipped))


def _point(ex, runner, model, vocab, gen, phase: str, b: int, n: int, repeats: int) -> list[float]:
    seqs = [f"{PREFIX}{phase}/{b}/{n}/{i}" for i in range(b)]
    try:

        def take(alloc: BlockAllocator) -> None:
            for s in seqs:
                alloc.allocate(s, model, n + repeats + 1)  # room for the timed decode steps

        ex.with_pool(take)
        prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for _ in seqs]
        prefill = [_step(ex, s, p, 0) for s, p in zip(seqs, prompts, strict=True)]
        runner.forward(prefill)  # warm-up (prefill) or the untimed context fill (decode)
        out = []
        for r in range(repeats):
            if phase == "prefill":
                steps = prefill
            else:
                steps = [_step(ex, s, [p[-1]], n + r) for s, p in zip(seqs, prompts, strict=True)]
            t0 = time.perf_counter()
            runner.forward(steps)
            if torch.device(ex.device).type == "cuda":
                torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return out
    finally:

        def release(alloc: BlockAllocator) -> None:
            for s in seqs:
                if s in alloc:
                    alloc.free(s)

        ex.with_pool(release)


def _step(ex: Executor, seq: str, token_ids: list[int], start: int) -> SeqStep:
    slots, blocks = ex.with_pool(lambda a: (a.slots(seq, start, start + len(token_ids)), a.table(seq).blocks))
    return SeqStep(
        token_ids=token_ids,
        start_pos=start,
        blocks=blocks,
        slots_block=[s.block for s in slots],
        slots_offset=[s.offset for s in slots],
    )
