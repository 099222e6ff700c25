"""A workload request's prompt content, as token ids and as the text a live replay sends.

A prompt with content (:attr:`WorkloadRequest.has_content`) is its service's system prompt
(``system_tokens`` tokens) followed by seeded segments (``parts``: ``(seed, tokens)``). A segment's
token ids are a deterministic stream of its seed, so equal segments are equal tokens and prompts that
share leading segments share a prefix; a system prompt of k tokens is the first k tokens of its
service's stream, so shorter ones are prefixes of longer ones. Token ids are word indices below
:data:`VOCAB`; the text is those words, ``t<id>``, separated by spaces: one token per word on the
emulated engines (whose tokenizer counts whitespace-separated words), and a shared text prefix (so a
shared token prefix at word boundaries) on a real tokenizer.

- :func:`prompt_token_ids`: the ids (for an engine model of prefix caching).
- :func:`prompt_text`: the text (``llmfleet load`` sends it; the simulator gives it to dispatch
  policies that read the prompt, so both see the same prompt).
- :func:`with_system_prompts`: a workload of plain requests (lengths only) given content: each
  request starts with its service's system prompt, and the rest of its prompt is its own.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

from llmfleet.workload.request import Workload, WorkloadRequest

# prompt words are t0 … t99: the emulated engines' word tokenizer gives each exactly one token id
# (llmfleet_engine.emulated.tokenizer.word), so live emulated prompts share prefixes as simulated ones do
VOCAB = 100
WORDS = tuple(f"t{k}" for k in range(VOCAB))

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def stable_seed(*labels: object) -> int:
    """A 64-bit seed from labels, the same in every process (Python's ``hash`` is salted)."""
    text = "\x1f".join(str(x) for x in labels).encode()
    return int.from_bytes(blake2b(text, digest_size=8).digest(), "little")


def segment_ids(seed: int, tokens: int) -> np.ndarray:
    """``tokens`` ids of segment ``seed`` (SplitMix64 over the positions: a prefix of a longer one)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + _GOLDEN * (np.arange(tokens, dtype=np.uint64) + np.uint64(1))
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(VOCAB)).astype(np.int64)


def system_seed(service: str) -> int:
    """The seed of ``service``'s system prompt."""
    return stable_seed("system", service)


def prompt_token_ids(r: WorkloadRequest) -> np.ndarray:
    """The token ids of ``r``'s prompt (ValueError when it has no content)."""
    if not r.has_content:
        raise ValueError(f"{r.request_id}: the request has no prompt content (only its length)")
    pieces = [segment_ids(system_seed(r.service), r.system_tokens)]
    pieces += [segment_ids(seed, n) for seed, n in r.parts]
    return np.concatenate(pieces)


def output_token_ids(r: WorkloadRequest) -> np.ndarray:
    """The token ids of the output the workload assumes for ``r`` (ValueError without ``output_seed``)."""
    if r.output_seed is None:
        raise ValueError(f"{r.request_id}: the request does not say what its output holds (no output_seed)")
    return segment_ids(r.output_seed, r.output_tokens)


def segment_text(seed: int, tokens: int) -> str:
    """A seeded segment (:func:`segment_ids`) as words."""
    words = WORDS
    return " ".join([words[k] for k in segment_ids(seed, tokens).tolist()])


def prompt_text(r: WorkloadRequest) -> str:
    """``r``'s prompt as words (see the module docstring); "" when it has no content."""
    if not r.has_content:
        return ""
    words = WORDS
    return " ".join([words[k] for k in prompt_token_ids(r).tolist()])


def with_system_prompts(workload: Workload, system_tokens: int, seed: int = 0) -> Workload:
    """Every request without content starts with its service's system prompt of ``system_tokens``
    tokens (all of its prompt when shorter), and the rest of its prompt is a segment of its own
    (seeded by ``seed`` and its id). Requests with content are kept as they are."""
    if isinstance(system_tokens, bool) or not isinstance(system_tokens, int) or system_tokens < 1:
        raise ValueError(f"system_tokens must be an int >= 1, got {system_tokens!r}")
    out = []
    for r in workload.requests:
        if r.has_content or r.prompt_tokens == 0:
            out.append(r)
            continue
        system = min(system_tokens, r.prompt_tokens)
        rest = r.prompt_tokens - system
        parts = ((stable_seed(seed, r.request_id), rest),) if rest else ()
        out.append(
            WorkloadRequest(
                r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.service, r.model,
                system_tokens=system, parts=parts, session=r.session,
            )
        )  # fmt: skip
    return Workload(tuple(out))
