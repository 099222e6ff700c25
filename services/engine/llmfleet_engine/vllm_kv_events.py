"""How many KV blocks one model's vLLM engine caches, from vLLM's own KV-cache events.

vLLM keeps its prefix cache in its engine core's process and says nothing of its size in its
scheduler stats (``kv_cache_usage`` counts the blocks requests hold; idle cached blocks sit in its
free queue). With ``kv_events_config`` on, its scheduler publishes every change of the cache over
ZeroMQ, the interface llm-d's KV indexer reads: ``BlockStored`` (full blocks cached, by hash),
``BlockRemoved`` (hashes evicted) and ``AllBlocksCleared`` (a cache reset), in batches numbered
0, 1, 2, ... on a PUB socket, with the last batches kept for replay on a ROUTER socket.

:class:`CachedBlocks` subscribes to one engine's events on a thread of its own and keeps the set of
cached hashes of its main pool (medium ``GPU``, or unnamed; blocks an offloading connector reports on
the CPU or storage are not the pool's). It counts hashes, not events: vLLM may report a reused block
again (its ``kv_cache_report_mode="full"``), which must not count twice. A batch lost on the way (a
gap in the numbers, e.g. the first batches sent before the subscription took hold) is fetched from the
replay socket, as soon as a later batch shows the gap, and while none arrives by asking the replay
socket every ``CATCH_UP_S`` for batches past the last one seen (a lost last batch shows no gap); when
replay cannot fill a gap (the publisher's buffer moved on), or the replay socket stops answering
(``SILENT_CATCH_UPS`` catch-ups in a row: the sockets are gone while the engine runs), the count is
unknown from then on (:meth:`CachedBlocks.count` is None) rather than wrong, and the load report says
nothing of the cache's size, as before.

The events ride on ``ipc://`` sockets in a private directory (:func:`endpoints`), so they never leave
the node. A ``kv_events_config`` the settings' ``engine_args`` give (e.g. to feed llm-d's indexer
too) is vLLM's as written; the count then subscribes to its sockets (:func:`user_endpoints`: the
addresses it binds, read as this host's), provided it publishes over ZeroMQ with a replay socket, since
without replay a lost batch could not be told from none. No vLLM is needed to import this module; the
batch decoder is vLLM's own (``vllm.distributed.kv_events.KVEventBatch``), passed in.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAIN_MEDIA = frozenset({None, "GPU"})  # the engine's own KV pool (vLLM names it GPU on its CPU build too)
END_SEQ = -1  # the replay socket's end-of-replay marker (a signed 8-byte sequence number)
POLL_MS = 100  # how often the subscriber thread looks at whether it was closed
REPLAY_TIMEOUT_MS = 2000  # the longest wait for a replayed batch
CATCH_UP_S = 1.0  # while no batch arrives, how often the replay socket is asked for any missed
SILENT_CATCH_UPS = 3  # unanswered catch-ups in a row after which the events are taken as lost
DEFAULT_ENDPOINT = "tcp://*:5557"  # vLLM's KVEventsConfig.endpoint when a config leaves it out


@dataclass(frozen=True)
class EventEndpoints:
    """Where one engine publishes its KV events (``publish``) and replays missed batches (``replay``)."""

    publish: str
    replay: str


def endpoints(directory: str | Path, name: str) -> EventEndpoints:
    """``ipc://`` endpoints for the engine ``name`` (any string) under ``directory``."""
    slug = "".join(c if c.isalnum() else "-" for c in name)[:40] or "model"
    base = Path(directory) / slug
    return EventEndpoints(f"ipc://{base}.kv-events", f"ipc://{base}.kv-replay")


def user_endpoints(config: Mapping[str, Any] | Any) -> EventEndpoints | None:
    """Where a user's ``kv_events_config`` (a mapping, as a cluster file gives it, or vLLM's
    ``KVEventsConfig``) has the engine publish, as a subscriber on this host connects to it: a TCP
    address bound on every interface (``*``, ``0.0.0.0``, ``::``) reads as the loopback's. None when
    it publishes nothing to count from: events off, a publisher other than ZeroMQ, or no replay
    socket (the reason is logged)."""

    def get(key: str, default: Any) -> Any:
        if isinstance(config, Mapping):
            return config.get(key, default)
        return getattr(config, key, default)

    if not get("enable_kv_cache_events", False):
        return None
    publisher = get("publisher", None) or "zmq"
    replay = get("replay_endpoint", None)
    if publisher != "zmq" or not replay:
        log.warning(
            "kv_events_config publishes %s: the prefix cache's size is not counted (it needs ZeroMQ with "
            "a replay_endpoint)",
            "no replay socket" if publisher == "zmq" else f"with publisher {publisher!r}",
        )
        return None
    return EventEndpoints(_connectable(get("endpoint", DEFAULT_ENDPOINT)), _connectable(replay))


def _connectable(endpoint: str) -> str:
    """The address a subscriber on this host connects to for a publisher bound at ``endpoint``."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:
        return endpoint
    host, _, port = rest.rpartition(":")
    if host in ("*", "0.0.0.0"):
        return f"tcp://127.0.0.1:{port}"
    if host in ("[::]", "::", "[*]"):
        return f"tcp://[::1]:{port}"
    return endpoint


def private_directory() -> str:
    """A fresh directory only this user can open, for a node's event sockets."""
    return tempfile.mkdtemp(prefix="llmfleet-kv-events-")


class CachedBlocks:
    """The cached KV blocks of one vLLM engine, counted from its events (see the module docstring).

    ``decode`` turns a published payload into vLLM's ``KVEventBatch``. The subscription starts at once;
    :meth:`close` stops it."""

    def __init__(self, where: EventEndpoints, decode: Callable[[bytes], Any], name: str = "") -> None:
        import zmq

        self.where = where
        self.name = name
        self._decode = decode
        self._lock = threading.Lock()
        self._hashes: set[tuple[Any, Any]] = set()  # (KV cache group, block hash)
        self._next_seq = 0  # the batch number expected next
        self._lost = False
        self._closed = threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(where.publish)
        self.batches = 0  # batches applied (received or replayed)
        self.replayed = 0  # of them, fetched from the replay socket
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{name}", daemon=True)
        self._thread.start()

    def count(self) -> int | None:
        """Blocks cached now (held by requests or idle); None once events were lost for good."""
        with self._lock:
            return None if self._lost else len(self._hashes)

    def close(self, timeout_s: float = 5.0) -> None:
        self._closed.set()
        self._thread.join(timeout_s)
        with contextlib.suppress(Exception):
            self._sub.close(linger=0)
            self._ctx.term()

    # ----------------------------------------------------------------------------------- thread

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        checked = 0.0  # when the replay socket was last asked for batches past the last one seen
        silent = 0  # catch-ups in a row the replay socket did not answer
        while not self._closed.is_set():
            try:
                if dict(poller.poll(POLL_MS)):
                    _, seq_bytes, payload = self._sub.recv_multipart()
                    self._receive(int.from_bytes(seq_bytes, "big", signed=True), payload)
                elif time.monotonic() - checked >= CATCH_UP_S:
                    checked = time.monotonic()
                    caught = self._replay()
                    silent = silent + 1 if caught is None else 0
                    if caught is False or silent >= SILENT_CATCH_UPS:
                        self._lose()
                        return
            except zmq.ZMQError:
                if self._closed.is_set():
                    return
                log.warning("KV events of %s: the subscription failed", self.name, exc_info=True)
                self._lose()
                return
            except Exception:  # a payload vLLM's decoder refuses: the count can no longer be trusted
                log.warning("KV events of %s: cannot read a batch", self.name, exc_info=True)
                self._lose()
                return

    def _receive(self, seq: int, payload: bytes) -> None:
        if seq < self._next_seq:
            return  # applied already (from a replay)
        if seq > self._next_seq and not self._replay(seq):
            self._lose()
            return
        self._apply(seq, payload)

    def _replay(self, upto: int | None = None) -> bool | None:
        """Apply the batches from ``_next_seq`` on (up to ``upto`` − 1) that the replay socket holds.

        True when they follow on without a gap (and reach ``upto``); False when the replay socket no
        longer holds the next one but later ones (the publisher's buffer moved on), or does not answer
        while a gap is known (``upto``); None when it does not answer otherwise (asked again later)."""
        import zmq

        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVTIMEO, REPLAY_TIMEOUT_MS)
        gap = False
        try:
            sock.connect(self.where.replay)
            sock.send_multipart((b"", self._next_seq.to_bytes(8, "big")))
            while True:
                _, _, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    break
                if upto is not None and seq >= upto:
                    continue
                if seq == self._next_seq:
                    self._apply(seq, payload)
                    self.replayed += 1
                elif seq > self._next_seq:
                    gap = True
        except zmq.ZMQError:
            if upto is None:
                return None
            log.warning("KV events of %s: no replay of batches %d..%d", self.name, self._next_seq, upto - 1)
            return False
        finally:
            sock.close(linger=0)
        return not gap and (upto is None or self._next_seq == upto)

    def _apply(self, seq: int, payload: bytes) -> None:
        batch = self._decode(payload)
        with self._lock:
            hashes = self._hashes
            for event in batch.events:
                kind = type(event).__name__
                if kind == "AllBlocksCleared":
                    hashes.clear()
                elif getattr(event, "medium", None) not in MAIN_MEDIA:
                    continue
                elif kind == "BlockStored":
                    hashes.update((event.group_idx, h) for h in event.block_hashes)
                elif kind == "BlockRemoved":
                    hashes.difference_update((event.group_idx, h) for h in event.block_hashes)
            self._next_seq = seq + 1
            self.batches += 1

    def _lose(self) -> None:
        with self._lock:
            if not self._lost:
                log.warning("KV events of %s were lost: its cached blocks are no longer reported", self.name)
            self._lost = True
            self._hashes.clear()
