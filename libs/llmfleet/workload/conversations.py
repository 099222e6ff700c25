"""Multi-turn conversations in which each turn resends the history, from published chat statistics.

A conversation is a system prompt (its service's, ``system_tokens`` tokens) and turns of a user
message and an answer. Turn k's request has the prompt system + u1 + a1 + … + u(k−1) + a(k−1) + uk
and the output ak: each turn resends everything before it, as chat clients do, so its prompt's
prefix is the previous turn's whole prompt and answer. The answers in the history are the workload's
own, and each request says so (``output_seed``): a simulated engine takes that answer as its
output, so it caches the answer's blocks as a live engine caches its sampled tokens' and the next
turn starts on them. ``llmfleet load`` resends what the engine actually answered instead (as a chat
client does), so live the next turn finds the answer cached whatever the model said.

**Statistics** (``LMSYS_CHAT_1M``): Zheng et al., "LMSYS-Chat-1M: A Large-Scale Real-World LLM
Conversation Dataset", ICLR 2024, Table 1: 1,000,000 conversations, on average 2.0 turns per
conversation, 69.5 tokens per user prompt and 214.5 tokens per response. The paper gives means, not
distributions, so the shapes are OUR assumptions: the number of turns is geometric on 1, 2, … with the
published mean (half of the conversations are single-turn at a mean of 2; CachedAttention, Gao et al.,
USENIX ATC 2024, §2, reports 73% of ShareGPT's conversations multi-turn, so pass ``mean_turns`` to
model a chattier population), and message lengths are independent log-normals with σ = 1.0 of the log
(:func:`~llmfleet.workload.paperlike.lognormal_lengths`, the same shape assumption as the ShareGPT-like
lengths) with the published means. A conversation ends at its last turn or before a turn whose prompt
plus answer would pass ``max_context`` tokens.

**Arrivals, closed loop.** Conversations start as a Poisson process at ``rate`` conversations per
second; a turn is sent an exponential think time (mean ``think_s``) after the previous turn's answer
has finished, as a user reads the answer before typing the next message: each later turn ``follows``
the one before (:class:`~llmfleet.workload.request.WorkloadRequest`), and the simulator and
``llmfleet load`` both wait for it. So a slow answer delays the rest of its conversation, as it does
for a real user, and a turn never arrives before the history it resends has been computed. A turn's
``arrival_s`` is its earliest time (the previous turn's arrival plus the think time).
Conversations are dealt round-robin to ``services``; request ids are ``conv<c>-t<k>`` and every turn
carries its conversation as ``session`` (``conv<c>``).

**Users, a closed population** (:func:`users`). ``n`` users, each holding one conversation after
another: a user's first turn is at ``u / n × think_s`` (the population starts evenly over one think
time), and each later conversation's first turn follows the user's previous conversation's last turn
by an exponential think time (mean ``think_s``), as a user who has read an answer opens a new chat.
A user stops at the first turn whose earliest time passes ``span_s``. A turn's real time is never
before its earliest time, so all ``n`` users are active up to ``span_s`` at least, whatever the
serving delays: the load is the population, not an arrival rate, and a saturated cluster slows the
users down instead of growing a queue of new conversations. In the steady state the turns mix in the
workload's own proportions (about 1 in ``mean_turns`` is a first turn), where an open stream of new
conversations past capacity holds mostly first turns. Multi-turn serving benchmarks load a server
this way: a fixed number of clients, each running its conversations one after another (vLLM's
``benchmarks/multi_turn``). Request ids are ``user<u>-conv<c>-t<k>``, sessions ``user<u>-conv<c>``;
users are dealt round-robin to ``services``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from llmfleet.workload.arrivals import poisson
from llmfleet.workload.paperlike import LengthStats, lognormal_lengths
from llmfleet.workload.prompts import stable_seed
from llmfleet.workload.request import Workload, WorkloadRequest


@dataclass(frozen=True)
class ConversationStats:
    """Published means of a multi-turn chat data set: turns per conversation, tokens per user message
    and per answer, and where they come from."""

    mean_turns: float
    mean_user_tokens: float
    mean_answer_tokens: float
    source: str


THINK_S = 10.0  # default mean seconds between a conversation's turns
MAX_CONTEXT = 4096  # default tokens a conversation's prompt plus answer stays within
SPAN_S = 60.0  # default seconds a closed population of users keeps opening turns
_MAX_REDRAWS = 1000  # conversations in a row a user may draw that do not fit max_context

LMSYS_CHAT_1M = ConversationStats(
    2.0,
    69.5,
    214.5,
    "LMSYS-Chat-1M (Zheng et al., ICLR 2024) Table 1: 2.0 turns per conversation, 69.5 tokens per "
    "prompt, 214.5 per response",
)


def conversations(
    n: int,
    *,
    rate: float,
    stats: ConversationStats = LMSYS_CHAT_1M,
    mean_turns: float | None = None,
    system_tokens: int = 0,
    think_s: float = THINK_S,
    max_context: int = MAX_CONTEXT,
    services: Sequence[str] = ("default",),
    seed: int = 0,
) -> Workload:
    """``n`` conversations (see the module docstring); ``mean_turns`` overrides ``stats``' mean."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    turns_mean = _checked(stats, mean_turns, system_tokens, think_s, max_context, services)
    rng = np.random.default_rng([seed, 0x636F6E76])  # its own stream: "conv"
    starts = poisson(rate, n=n, seed=rng)
    turns = rng.geometric(1.0 / turns_mean, size=n)
    total = int(turns.sum())
    lengths = lognormal_lengths(
        LengthStats(stats.mean_user_tokens, stats.mean_answer_tokens, stats.source), total, seed=rng
    )
    gaps = rng.exponential(think_s, size=total) if think_s > 0 else np.zeros(total)
    out: list[WorkloadRequest] = []
    k0 = 0
    for c in range(n):
        k = int(turns[c])
        out += _turns(
            f"conv{c}", services[c % len(services)], float(starts[c]), lengths[k0 : k0 + k], gaps[k0 : k0 + k],
            system_tokens=system_tokens, max_context=max_context, seed=seed,
        )  # fmt: skip
        k0 += k
    return Workload(tuple(out))


def users(
    n: int,
    *,
    span_s: float = SPAN_S,
    stats: ConversationStats = LMSYS_CHAT_1M,
    mean_turns: float | None = None,
    system_tokens: int = 0,
    think_s: float = THINK_S,
    max_context: int = MAX_CONTEXT,
    services: Sequence[str] = ("default",),
    seed: int = 0,
) -> Workload:
    """A closed population of ``n`` users, each holding one conversation after another for ``span_s``
    seconds (see the module docstring's "Users")."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if not (math.isfinite(span_s) and span_s > 0):
        raise ValueError(f"span_s must be finite and > 0, got {span_s!r}")
    turns_mean = _checked(stats, mean_turns, system_tokens, think_s, max_context, services)
    if think_s <= 0:
        raise ValueError(f"users need think_s > 0 (a user's turns would never pass span_s), got {think_s!r}")
    rng = np.random.default_rng([seed, 0x7573657273])  # its own stream: "users"
    lengths_of = LengthStats(stats.mean_user_tokens, stats.mean_answer_tokens, stats.source)
    out: list[WorkloadRequest] = []
    for u in range(n):
        t, last, c, empty = think_s * u / n, None, 0, 0  # the users start evenly over one think time
        while True:
            k = int(rng.geometric(1.0 / turns_mean))
            lengths = lognormal_lengths(lengths_of, k, seed=rng)
            gaps = rng.exponential(think_s, size=k)
            if last is not None:  # the user reads the last answer, then opens a new conversation
                t = last.arrival_s + float(gaps[0])
            if t > span_s:
                break
            conv = _turns(
                f"user{u}-conv{c}", services[u % len(services)], t, lengths, gaps,
                system_tokens=system_tokens, max_context=max_context, seed=seed, after=last,
            )  # fmt: skip
            if not conv:  # its first turn alone passes max_context: the user opens another one
                empty += 1
                if empty > _MAX_REDRAWS:
                    raise ValueError(f"max_context {max_context} leaves almost no conversation room")
                continue
            kept = [r for r in conv if r.arrival_s <= span_s]
            out += kept
            if len(kept) < len(conv):
                break
            last, c = conv[-1], c + 1
    return Workload(tuple(out))


def _checked(
    stats: ConversationStats,
    mean_turns: float | None,
    system_tokens: int,
    think_s: float,
    max_context: int,
    services: Sequence[str],
) -> float:
    """The mean number of turns, after checking the shape arguments ``conversations`` and ``users``
    share."""
    turns_mean = stats.mean_turns if mean_turns is None else float(mean_turns)
    if not (math.isfinite(turns_mean) and turns_mean >= 1):
        raise ValueError(f"mean_turns must be finite and >= 1, got {turns_mean!r}")
    if not (math.isfinite(think_s) and think_s >= 0):
        raise ValueError(f"think_s must be finite and >= 0, got {think_s!r}")
    if isinstance(system_tokens, bool) or not isinstance(system_tokens, int) or system_tokens < 0:
        raise ValueError(f"system_tokens must be an int >= 0, got {system_tokens!r}")
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context <= system_tokens + 1:
        raise ValueError(f"max_context must be an int > system_tokens + 1, got {max_context!r}")
    if not services or any(not isinstance(s, str) or not s for s in services):
        raise ValueError(f"services must be non-empty names, got {services!r}")
    return turns_mean


def _turns(
    session: str,
    service: str,
    t: float,
    lengths: np.ndarray,
    gaps: np.ndarray,
    *,
    system_tokens: int,
    max_context: int,
    seed: int,
    after: WorkloadRequest | None = None,
) -> list[WorkloadRequest]:
    """The requests of one conversation whose first turn's earliest time is ``t``: one per (user, answer)
    length pair, a later turn ``gaps[k]`` after the one before, up to the turn that would pass
    ``max_context``. The first turn follows ``after`` (a user's previous conversation) when given."""
    out: list[WorkloadRequest] = []
    history: list[tuple[int, int]] = []
    context = system_tokens
    for k, (user, answer) in enumerate((int(u), int(a)) for u, a in lengths):
        if context + user + answer > max_context:
            break
        think = float(gaps[k]) if k or after is not None else 0.0
        if k:
            t += think
        history.append((stable_seed(seed, session, "user", k), user))
        context += user
        answer_seed = stable_seed(seed, session, "answer", k)
        follows = f"{session}-t{k}" if k else (after.request_id if after is not None else "")
        out.append(
            WorkloadRequest(
                f"{session}-t{k + 1}", t, context, answer, service, system_tokens=system_tokens,
                parts=tuple(history), session=session, follows=follows, think_s=think, output_seed=answer_seed,
            )
        )  # fmt: skip
        history.append((answer_seed, answer))
        context += answer
    return out


def deal_sessions(workload: Workload, services: Sequence[tuple[str, str]]) -> Workload:
    """Label the requests with ``services`` ((name, model) pairs) by conversation: each session, in
    order of its first arrival, goes round-robin to the next service, whole (a request without a
    session is a conversation of its own). Its system prompt is then its new service's."""
    if not services:
        raise ValueError("no service to deal conversations to")
    where: dict[str, tuple[str, str]] = {}
    out = []
    for r in workload.requests:
        key = r.session or f"\0{r.request_id}"
        svc = where.get(key)
        if svc is None:
            svc = where[key] = services[len(where) % len(services)]
        out.append(replace(r, service=svc[0], model=svc[1]))
    return Workload(tuple(out))
