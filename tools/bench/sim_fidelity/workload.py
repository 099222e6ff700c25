"""What the fidelity benchmark runs: its constants and settings, the planned workload and its prompts."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from llmfleet.workload import poisson

MODEL = "tiny-llama"  # catalog name (llmfleet.costmodel.models) of the engine's model
SERVICE = "fidelity"
HARDWARE = "cpu"
ENGINE_ID = "engine-0"
GOAL = 0.10  # the goal: live vs sim within 10 %
# Characters the tiny byte-level BPE tokenizer never merges (absent from its training corpus): a prompt
# of k of them is exactly k tokens plus <s> (checked against the engine's count in every run).
PROMPT_ALPHABET = "~^|@#$%&*=`"
VARIANTS = {"raw": "raw fit", "calibrated": "calibrated", "deployed": "calibrated as deployed"}


@dataclass(frozen=True)
class Settings:
    requests: int = 200
    rate_rps: float = 12.0
    seed: int = 0
    prompt_min: int = 16
    prompt_max: int = 256
    output_min: int = 8
    output_max: int = 64
    max_batch: int = 16  # --max-running = --max-batch-requests (the sim's max_requests is both)
    max_prefill_tokens: int = 1024
    threads: int = 1
    memory_budget: str = "512MiB"
    block_bytes: int = 64 * 1024
    watermark: float = 0.01
    sweep_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    sweep_inputs: tuple[int, ...] = (16, 32, 64, 128, 256)
    sweep_contexts: tuple[int, ...] = (16, 64, 128, 256, 320)
    sweep_repeats: int = 5
    scheduler_predict: bool = False  # the scheduler's output-length Predict round trip before dispatch
    live_runs: int = 2  # the identical workload this many times: the run-to-run spread is the noise floor
    direct_run: bool = True  # diagnostic: the workload once more, straight to the engine
    calibrate: bool = True
    calib_batches: tuple[int, ...] = (1, 2, 4, 8)
    calib_rounds: int = 2  # per calibration phase (phases: before, between and after the runs)
    calib_prompt: int = 32
    calib_output: int = 64

    def __post_init__(self) -> None:
        if self.requests < 1 or self.rate_rps <= 0 or self.live_runs < 1:
            raise ValueError("requests, rate and live runs must be positive")
        if not 2 <= self.prompt_min <= self.prompt_max or not 2 <= self.output_min <= self.output_max:
            raise ValueError("length ranges must satisfy 2 <= min <= max")
        if self.max_batch < 1 or self.max_prefill_tokens < 1 or self.threads < 1:
            raise ValueError("engine knobs must be positive")
        if self.calib_output < 2 or self.calib_prompt < 2 or self.calib_rounds < 1:
            raise ValueError("calibration requests need >= 2 prompt and output tokens, rounds >= 1")


@dataclass(frozen=True)
class PlannedRequest:
    request_id: str
    arrival_s: float  # from the workload's start
    prompt_tokens: int  # including <s>
    output_tokens: int


def plan_workload(s: Settings) -> list[PlannedRequest]:
    """Seeded Poisson arrivals (``llmfleet.workload.poisson``), uniform prompt and output lengths."""

    arrivals = poisson(s.rate_rps, n=s.requests, seed=s.seed)
    rng = np.random.default_rng(s.seed + 1)
    prompts = rng.integers(s.prompt_min, s.prompt_max + 1, size=s.requests)
    outputs = rng.integers(s.output_min, s.output_max + 1, size=s.requests)
    return [
        PlannedRequest(f"r{i}", float(a), int(p), int(o))
        for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))
    ]


def make_prompt(tokens: int, rng: random.Random) -> str:
    """A prompt of ``tokens`` tokens for the tiny tokenizer: ``tokens - 1`` unmerged symbols + <s>."""
    if tokens < 2:
        raise ValueError(f"a prompt needs at least 2 tokens (<s> + one), got {tokens}")
    return "".join(rng.choice(PROMPT_ALPHABET) for _ in range(tokens - 1))
