"""Groups of prompts that share a long system prompt: the workload of llm-d's prefix-cache benchmark.

``shared_prefix`` mirrors the ``shared_prefix`` data generator of inference-perf (kubernetes-sigs),
which llm-d's published prefix-cache-aware routing runs use (16 H100 as 8 TP-2 replicas of
Qwen3-32B: 150 groups, 5 prompts per group, a 6,000-token system prompt, a 1,200-token question,
1,000 output tokens, the output length fixed with ``ignore_eos``):

- ``groups`` system prompts of ``system_tokens`` tokens each, and per group ``prompts_per_group``
  questions of ``question_tokens`` tokens; a prompt is its group's system prompt followed by one of
  the group's questions (``groups × prompts_per_group`` distinct prompts);
- the prompts are shuffled once (seeded) and the requests take them in that order, cycling, as
  inference-perf's generator does, so a full prompt recurs every ``groups × prompts_per_group``
  requests and a group's system prompt every ``groups`` requests on average;
- every request asks for exactly ``output_tokens`` tokens;
- arrivals are a Poisson process at ``rate`` requests per second.

The prompts' content is seeded segments (``WorkloadRequest.parts``: the group's system prompt, then
the question), so two requests of a group share exactly the system prompt's prefix and nothing else,
in the simulator's token ids and in the text ``llmfleet load`` sends. Requests are dealt round-robin
to ``services``; ids are ``sp<k>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmfleet.workload.arrivals import poisson
from llmfleet.workload.prompts import stable_seed
from llmfleet.workload.request import Workload, WorkloadRequest

# inference-perf's shared_prefix settings in llm-d's published prefix-cache runs
GROUPS, PROMPTS_PER_GROUP, SYSTEM_TOKENS, QUESTION_TOKENS, OUTPUT_TOKENS = 150, 5, 6000, 1200, 1000


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def shared_prefix(
    n: int,
    *,
    rate: float,
    groups: int = GROUPS,
    prompts_per_group: int = PROMPTS_PER_GROUP,
    system_tokens: int = SYSTEM_TOKENS,
    question_tokens: int = QUESTION_TOKENS,
    output_tokens: int = OUTPUT_TOKENS,
    services: Sequence[str] = ("default",),
    seed: int = 0,
) -> Workload:
    """``n`` requests over ``groups × prompts_per_group`` prompts (see the module docstring)."""
    for name, value in (
        ("n", n), ("groups", groups), ("prompts_per_group", prompts_per_group),
        ("system_tokens", system_tokens), ("question_tokens", question_tokens), ("output_tokens", output_tokens),
    ):  # fmt: skip
        _positive(name, value)
    if not services or any(not isinstance(s, str) or not s for s in services):
        raise ValueError(f"services must be non-empty names, got {services!r}")
    rng = np.random.default_rng([seed, 0x73686172])  # its own stream: "shar"
    starts = poisson(rate, n=n, seed=rng)
    prompts = [(g, q) for g in range(groups) for q in range(prompts_per_group)]
    order = rng.permutation(len(prompts))
    prompt_tokens = system_tokens + question_tokens
    out = []
    for k in range(n):
        g, q = prompts[int(order[k % len(prompts)])]
        parts = (
            (stable_seed(seed, f"group{g}", "system", 0), system_tokens),
            (stable_seed(seed, f"group{g}", "question", q), question_tokens),
        )
        out.append(
            WorkloadRequest(
                f"sp{k}",
                float(starts[k]),
                prompt_tokens,
                output_tokens,
                services[k % len(services)],
                parts=parts,
            )
        )
    return Workload(tuple(out))
