"""Prefix-affinity dispatch: send a request where its prompt's prefix is expected to be cached, within
a load bound, so that cache hits never pile a burst onto one engine.

**What is hashed.** A dispatch decision sees the prompt's *text* (``DispatchRequest.prompt``), not its
token ids: the scheduler holds no tokenizer (the engines tokenize), and the simulator renders a
workload request's prompt content as the text ``llmfleet load`` would send. The policy splits the
UTF-8 text into fixed-size chunks of ``block_bytes`` bytes (default 256, about 64 tokens of English at
~4 bytes per token, llm-d's block of 64 tokens) and hashes them with the KV pool's hash chain
(:func:`llmfleet.kvblocks.prefix.prefix_block_hashes`, over the model, the parent block's hash and the
block's ids), the text's 8-byte words standing for token ids: equal hashes mean equal prefixes, and
two models never share one. Chunks rather than the token estimator's pieces: chunking costs one encode
and a cast (no regex pass per prompt in the scheduler), and nothing requires chunk boundaries to be
token boundaries, since the chain is only ever compared with chains this policy computed (so these
hashes do not match the engines' own, which are over real token ids and the engine's block size). A
prefix that ends mid-chunk matches its full chunks only, as an engine's cache matches full KV blocks
only. :func:`prompt_blocks` is that one way.

**Index.** Per engine, the blocks it is expected to hold, fed by this policy's own dispatch history
and corrected by the engines' reports:

* the chosen engine computes (or reuses) every block of the prompt, so after a dispatch it holds them;
* each engine's entries are LRU-ordered and bounded (``capacity_blocks``; by default what the engine's
  KV pool can hold, from its reported capacity), inserted tail first so the LRU end drops a prompt's
  tail before its head, as paged caches evict;
* an entry untouched for ``ttl_s`` seconds counts as gone;
* when an engine reports a new size of its prefix cache (``EngineCandidate.prefix_cached_bytes``: its
  cached blocks, held or idle), the engine's entries are cut from the LRU end to that size in chunks:
  an engine that evicted under memory pressure, restarted or unloaded the model (0 bytes) is no longer
  credited with what it dropped. The cut acts on a *change* of the reported size only, so entries
  added since the last report (whose prefills the engine has not run yet) survive a stale report;
  engines that report no size (a vLLM engine whose KV-cache events are not counted) are corrected by
  expiry alone.

Time is the request's ``arrival_s`` (the caller's clock): the policy reads no clock.

**Choice.** Among the eligible engines, those whose load (``queued``: running + waiting, which the
live load book raises by every request sent since the engine's last report) is within the bound
``max(least + max_load_excess, least · max_load_ratio)`` of the least-loaded engine are *allowed*;
the others are never preferred for their cache. Among the allowed, the engine holding the longest
prefix of the prompt wins, then the least loaded, then the smallest id. So a burst of one prefix stays
on the engine that holds it only until that engine is past the bound; the next engine then gets it,
holds the prefix from then on, and the burst spreads over every engine by load (llm-d's failure, where
every request of a burst saw the same stale score, cannot happen: each dispatch raises the chosen
engine's load before the next choice). Without a prompt the choice is join-the-shortest-queue.

**Sessions.** A request naming a conversation (``session``) goes to the engine that served the
conversation last while that engine is allowed: the special case of a prefix known by name. The
session table is LRU-bounded (``max_sessions``) and expires with ``ttl_s`` too.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.kvblocks.prefix import prefix_block_hashes
from llmfleet.policies.dispatch.base import (
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    eligible,
    load_bounded,
)

BLOCK_BYTES = 256  # default chunk size: ~64 tokens at ~4 bytes per token
BYTES_PER_TOKEN = 4  # to convert an engine's KV capacity in tokens into chunks (English text, BPE)
DEFAULT_CAPACITY_BLOCKS = 4096  # per engine, when its KV capacity is unknown (~1M bytes of prompt)
MAX_BLOCKS = 256  # chunks of a prompt considered (a 64 KiB prefix)
TTL_S = 300.0  # seconds after which an index entry unused since counts as evicted


def prompt_blocks(
    model: str, prompt: str, block_bytes: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS
) -> list[int]:
    """The hash chain of ``prompt``'s full ``block_bytes`` chunks (UTF-8; a multiple of 8 bytes), at
    most ``max_blocks``: the KV pool's chain over the text's 8-byte words."""
    data = prompt.encode()
    words = array("q")
    words.frombytes(data[: len(data) // 8 * 8])
    return prefix_block_hashes(model, words, block_bytes // 8, max_blocks)


class ExpectedBlocks:
    """Per engine, the prompt blocks it is expected to hold: LRU-bounded, with expiry.

    ``insert(engine, chain, now, capacity)`` records that ``engine`` holds ``chain`` as of ``now``;
    ``depths(chain, now)`` is, per engine, how many leading blocks of ``chain`` it holds. An entry
    older than ``ttl_s`` counts as gone (and is dropped when met)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._held: dict[str, OrderedDict[int, float]] = {}  # engine -> block -> last use (LRU order)
        self._where: dict[int, set[str]] = {}  # block -> engines holding it

    def __len__(self) -> int:
        return sum(len(h) for h in self._held.values())

    def blocks(self, engine_id: str) -> int:
        """Entries kept for ``engine_id`` (expired ones not yet dropped included)."""
        held = self._held.get(engine_id)
        return len(held) if held is not None else 0

    def _drop(self, engine_id: str, block: int) -> None:
        engines = self._where.get(block)
        if engines is not None:
            engines.discard(engine_id)
            if not engines:
                del self._where[block]

    def insert(self, engine_id: str, chain: Sequence[int], now: float, capacity: int) -> None:
        held = self._held.get(engine_id)
        if held is None:
            held = self._held[engine_id] = OrderedDict()
        for block in reversed(chain):  # the head ends most recent: the LRU end drops tails first
            if block in held:
                held.move_to_end(block)
            else:
                self._where.setdefault(block, set()).add(engine_id)
            held[block] = now
        horizon = now - self.ttl_s
        while held:
            block, seen = next(iter(held.items()))
            if len(held) <= capacity and seen >= horizon:
                break
            del held[block]
            self._drop(engine_id, block)

    def trim(self, engine_id: str, keep: int) -> None:
        """Keep at most ``keep`` of ``engine_id``'s entries, dropping from the LRU end."""
        held = self._held.get(engine_id)
        if held is None:
            return
        while len(held) > keep:
            block, _ = held.popitem(last=False)
            self._drop(engine_id, block)

    def depths(self, chain: Sequence[int], now: float) -> dict[str, int]:
        """Per engine holding the chain's first block, the number of leading blocks it holds."""
        horizon = now - self.ttl_s
        depth: dict[str, int] = {}
        alive: set[str] | None = None
        for i, block in enumerate(chain):
            engines = self._where.get(block)
            if not engines:
                break
            current = set()
            for e in list(engines):
                if alive is not None and e not in alive:
                    continue
                held = self._held[e]
                if held[block] < horizon:  # expired: the engine has likely evicted it
                    del held[block]
                    self._drop(e, block)
                    continue
                current.add(e)
            if not current:
                break
            for e in current:
                depth[e] = i + 1
            alive = current
        return depth


@dataclass
class PrefixStats:
    """What the policy did: requests with a prompt, their blocks, the blocks the chosen engine was
    expected to hold, session hits, choices where the engine holding the most was over the bound, and
    index entries cut to the engines' reported prefix-cache sizes."""

    requests: int = 0
    blocks: int = 0
    matched_blocks: int = 0
    session_hits: int = 0
    over_bound: int = 0
    trimmed: int = 0

    @property
    def expected_hit_rate(self) -> float:
        return self.matched_blocks / self.blocks if self.blocks else 0.0


def _positive(name: str, value: object, kind: type[int] | type[float]) -> None:
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise ValueError(f"{name} must be {'an int' if kind is int else 'a number'}, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


@dataclass(frozen=True)
class PrefixAffinityOptions:
    """``block_bytes``: chunk size, bytes of UTF-8 text (a multiple of 8); ``max_blocks``: chunks of a
    prompt considered; ``capacity_blocks``: entries kept per engine (None: what the engine's KV pool
    holds, from its reported capacity and the request's KV bytes per token, else
    ``DEFAULT_CAPACITY_BLOCKS``); ``ttl_s``: seconds after which an unused entry counts as evicted;
    ``max_load_excess`` and ``max_load_ratio``: the load bound; ``max_sessions``: conversations
    remembered."""

    block_bytes: int = BLOCK_BYTES
    max_blocks: int = MAX_BLOCKS
    capacity_blocks: int | None = None
    ttl_s: float = TTL_S
    max_load_excess: int = 4
    max_load_ratio: float = 1.5
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        for name in ("block_bytes", "max_blocks", "max_sessions"):
            _positive(name, getattr(self, name), int)
        if self.block_bytes % 8:
            raise ValueError(f"block_bytes must be a multiple of 8, got {self.block_bytes}")
        if self.capacity_blocks is not None:
            _positive("capacity_blocks", self.capacity_blocks, int)
        _positive("ttl_s", self.ttl_s, float)
        excess = self.max_load_excess
        if isinstance(excess, bool) or not isinstance(excess, int) or excess < 0:
            raise ValueError(f"max_load_excess must be an int >= 0, got {excess!r}")
        _positive("max_load_ratio", self.max_load_ratio, float)
        if self.max_load_ratio < 1:
            raise ValueError(f"max_load_ratio must be >= 1, got {self.max_load_ratio!r}")
        object.__setattr__(self, "ttl_s", float(self.ttl_s))
        object.__setattr__(self, "max_load_ratio", float(self.max_load_ratio))


class PrefixAffinity:
    """The engine expected to hold the longest prefix of the prompt, among those within the load
    bound; then the least loaded; then the smallest id (see the module docstring and
    :class:`PrefixAffinityOptions`)."""

    name = "prefix_affinity"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True, reads_prompt=True)

    Options: ClassVar[type[PrefixAffinityOptions]] = PrefixAffinityOptions

    def __init__(self, options: PrefixAffinityOptions | None = None) -> None:
        self.options = options if options is not None else PrefixAffinityOptions()
        self.index = ExpectedBlocks(self.options.ttl_s)
        self.sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # session -> (engine, last use)
        self.stats = PrefixStats()
        self._reported: dict[str, int] = {}  # engine -> the prefix-cache size it reported last (bytes)

    def capacity(self, candidate: EngineCandidate, request: DispatchRequest) -> int:
        """Entries kept for ``candidate``: the option, else its KV pool's tokens in chunks, else the default."""
        if self.options.capacity_blocks is not None:
            return self.options.capacity_blocks
        if candidate.kv_capacity_bytes > 0 and request.kv_bytes_per_token > 0:
            return max(1, self.chunks(candidate.kv_capacity_bytes, request.kv_bytes_per_token))
        return DEFAULT_CAPACITY_BLOCKS

    def chunks(self, kv_bytes: int, bytes_per_token: int) -> int:
        """``kv_bytes`` of KV (at ``bytes_per_token`` > 0) as prompt chunks of text."""
        return int(kv_bytes / bytes_per_token * BYTES_PER_TOKEN / self.options.block_bytes)

    def correct(self, pool: Sequence[EngineCandidate], request: DispatchRequest) -> None:
        """Cut each engine's entries to the prefix-cache size it reports, when that size changed."""
        for c in pool:
            size = c.prefix_cached_bytes
            if size is None or self._reported.get(c.engine_id) == size:
                continue
            self._reported[c.engine_id] = size
            if size and request.kv_bytes_per_token <= 0:
                continue  # the size cannot be told in chunks: expiry alone corrects this engine
            keep = self.chunks(size, request.kv_bytes_per_token) if size else 0
            self.stats.trimmed += max(0, self.index.blocks(c.engine_id) - keep)
            self.index.trim(c.engine_id, keep)

    def _session_engine(self, session: str, now: float) -> str | None:
        hit = self.sessions.get(session) if session else None
        if hit is None:
            return None
        if hit[1] < now - self.options.ttl_s:
            del self.sessions[session]
            return None
        return hit[0]

    def _remember(self, session: str, engine_id: str, now: float) -> None:
        self.sessions[session] = (engine_id, now)
        self.sessions.move_to_end(session)
        while len(self.sessions) > self.options.max_sessions:
            self.sessions.popitem(last=False)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        if request is None:
            return min(pool, key=lambda c: c.queued).engine_id  # ties: the smallest id
        allowed, bound = load_bounded(pool, self.options.max_load_excess, self.options.max_load_ratio)
        now = request.arrival_s
        chain = (
            prompt_blocks(model, request.prompt, self.options.block_bytes, self.options.max_blocks)
            if request.prompt
            else []
        )
        if chain:
            self.correct(pool, request)
        depth = self.index.depths(chain, now) if chain else {}
        sticky = self._session_engine(request.session, now)
        best = None
        if sticky is not None:
            best = next((c for c in allowed if c.engine_id == sticky), None)
            self.stats.session_hits += best is not None
        if best is None:
            best = min(allowed, key=lambda c: (-depth.get(c.engine_id, 0), c.queued))  # ties: smallest id
        if chain:
            self.stats.requests += 1
            self.stats.blocks += len(chain)
            got = depth.get(best.engine_id, 0)
            self.stats.matched_blocks += got
            self.stats.over_bound += any(depth.get(c.engine_id, 0) > got for c in pool if c.queued > bound)
            self.index.insert(best.engine_id, chain, now, self.capacity(best, request))
        if request.session:
            self._remember(request.session, best.engine_id, now)
        return best.engine_id
