"""Counting a vLLM engine's cached KV blocks from its KV-cache events (``vllm_kv_events``), against
vLLM's own publisher (``ZmqEventPublisher``: its wire format, numbering and replay) on ``ipc://``
sockets, without an engine. The engine end to end is in test_vllm_backend.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llmfleet.supervisor import free_port
from llmfleet_engine import vllm_kv_events as kv_events
from llmfleet_engine.vllm_compat import import_vllm, kv_event_decoder
from llmfleet_engine.vllm_kv_events import CachedBlocks, EventEndpoints, endpoints, user_endpoints
from vllm_marks import requires_vllm

pytestmark = [*requires_vllm, pytest.mark.timeout(120)]
zmq = pytest.importorskip("zmq")  # vLLM brings pyzmq

WAIT_S = 20.0


def wait_for(predicate: Any, timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class Publisher:
    """vLLM's ZMQ KV-event publisher, as an engine core runs it, and the event classes."""

    def __init__(self, where: Any, buffer_steps: int = 10_000, topic: str = "", probe_at: str = "") -> None:
        """Bound at ``where`` (``probe_at``: where its probe connects, when not ``where.publish``)."""
        from vllm.distributed import kv_events as ev

        self.ev = ev
        self.pub = ev.ZmqEventPublisher(
            0, endpoint=where.publish, replay_endpoint=where.replay, buffer_steps=buffer_steps, topic=topic
        )
        self.sent = 0
        # a plain subscriber of its own, to know when batches have left (their receivers got them)
        self._ctx = zmq.Context()
        self._probe = self._ctx.socket(zmq.SUB)
        self._probe.setsockopt(zmq.SUBSCRIBE, b"")
        self._probe.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
        self._probe.connect(probe_at or where.publish)
        self._seen = 0
        time.sleep(0.3)  # the probe's subscription takes hold before anything is published

    def stored(self, *hashes: int, medium: str | None = "GPU", group: int = 0) -> Any:
        return self.ev.BlockStored(
            block_hashes=list(hashes),
            parent_block_hash=None,
            token_ids=[1] * (16 * len(hashes)),
            block_size=16,
            lora_id=None,
            medium=medium,
            lora_name=None,
            group_idx=group,
        )

    def removed(self, *hashes: int, group: int = 0) -> Any:
        return self.ev.BlockRemoved(block_hashes=list(hashes), medium="GPU", group_idx=group)

    def cleared(self) -> Any:
        return self.ev.AllBlocksCleared()

    def publish(self, *events: Any) -> None:
        self.pub.publish(self.ev.KVEventBatch(ts=time.time(), events=list(events)))
        self.sent += 1

    def flushed(self) -> None:
        """Wait until every batch published so far was sent (the probe received it)."""
        while self._seen < self.sent:
            self._probe.recv_multipart()
            self._seen += 1

    def close(self) -> None:
        self.pub.shutdown()
        self._probe.close(linger=0)
        self._ctx.term()


@pytest.fixture
def where(tmp_path: Path) -> Any:
    return endpoints(tmp_path, "tiny-model")


@pytest.fixture
def decode() -> Any:
    return kv_event_decoder(import_vllm())


@pytest.fixture
def publisher(where: Any) -> Iterator[Publisher]:
    pub = Publisher(where)
    try:
        yield pub
    finally:
        pub.close()


def counted(blocks: CachedBlocks, n: int) -> None:
    wait_for(lambda: blocks.batches >= n)


def test_counts_cached_hashes_once_and_only_the_pools(where: Any, decode: Any, publisher: Publisher) -> None:
    blocks = CachedBlocks(where, decode, "tiny-model")
    try:
        time.sleep(0.2)  # let the subscription take hold (a batch sent before it is replayed anyway)
        publisher.publish(publisher.stored(1, 2, 3))
        publisher.publish(publisher.stored(2))  # a reused block reported again counts once
        publisher.publish(publisher.stored(3, group=1))  # another KV cache group's block is another block
        publisher.publish(publisher.stored(7, medium="CPU"))  # an offloading tier, not the pool
        publisher.publish(publisher.removed(1), publisher.removed(9))  # 9: never cached
        counted(blocks, publisher.sent)
        assert blocks.count() == 3
        publisher.publish(publisher.cleared(), publisher.stored(5))
        counted(blocks, publisher.sent)
        assert blocks.count() == 1
    finally:
        blocks.close()


def test_batches_sent_before_the_subscription_are_replayed(
    where: Any, decode: Any, publisher: Publisher
) -> None:
    publisher.publish(publisher.stored(1, 2))
    publisher.publish(publisher.stored(3))
    publisher.flushed()  # sent to no one: the subscriber is not there yet
    blocks = CachedBlocks(where, decode, "tiny-model")
    try:
        time.sleep(0.2)
        publisher.publish(publisher.removed(2))
        counted(blocks, 3)
        assert blocks.count() == 2
        # both early batches came by replay; the later one too when the subscription took hold after it
        assert blocks.replayed >= 2
    finally:
        blocks.close()


def test_a_missed_last_batch_is_caught_up_while_none_follows(
    where: Any, decode: Any, publisher: Publisher
) -> None:
    """An engine's only batch sent before the subscription took hold: no later batch shows the gap, so
    the idle subscriber asks the replay socket."""
    publisher.publish(publisher.stored(1, 2, 3))
    publisher.flushed()
    blocks = CachedBlocks(where, decode, "tiny-model")
    try:
        wait_for(lambda: blocks.count() == 3)
        assert blocks.replayed == 1
    finally:
        blocks.close()


def test_a_gap_replay_cannot_fill_leaves_the_count_unknown(tmp_path: Path, decode: Any) -> None:
    where = endpoints(tmp_path, "short-buffer")
    publisher = Publisher(where, buffer_steps=1)  # keeps the last batch only
    try:
        publisher.publish(publisher.stored(1))
        publisher.publish(publisher.stored(2))
        publisher.publish(publisher.stored(3))
        publisher.flushed()
        blocks = CachedBlocks(where, decode, "tiny-model")
        try:
            time.sleep(0.2)
            publisher.publish(publisher.stored(4))
            wait_for(lambda: blocks.count() is None)
            publisher.publish(publisher.stored(5))
            time.sleep(0.3)
            assert blocks.count() is None  # it does not come back with a partial set
        finally:
            blocks.close()
    finally:
        publisher.close()


def test_a_publisher_gone_silent_leaves_the_count_unknown(
    where: Any, decode: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's sockets disappear while it is taken to run (no batch, no replay answer): after a
    few unanswered catch-ups the count is dropped, not kept stale."""
    monkeypatch.setattr(kv_events, "CATCH_UP_S", 0.05)
    monkeypatch.setattr(kv_events, "REPLAY_TIMEOUT_MS", 100)
    publisher = Publisher(where)
    blocks = CachedBlocks(where, decode, "tiny-model")
    try:
        publisher.publish(publisher.stored(1, 2))
        wait_for(lambda: blocks.count() == 2)
        publisher.close()
        wait_for(lambda: blocks.count() is None)
    finally:
        blocks.close()


def test_close_stops_the_subscriber(where: Any, decode: Any, publisher: Publisher) -> None:
    """After close, batches the engine still publishes are no longer applied."""
    blocks = CachedBlocks(where, decode, "tiny-model")
    publisher.publish(publisher.stored(1))
    wait_for(lambda: blocks.count() == 1)
    blocks.close()
    publisher.publish(publisher.stored(2, 3))
    publisher.flushed()  # sent: a subscriber still reading would have applied it by now
    time.sleep(0.3)
    assert (blocks.count(), blocks.batches) == (1, 1)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (  # vLLM's addresses bound on every interface read as the loopback's
            {
                "enable_kv_cache_events": True,
                "endpoint": "tcp://*:7001",
                "replay_endpoint": "tcp://0.0.0.0:7002",
            },
            EventEndpoints("tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"),
        ),
        (
            {
                "enable_kv_cache_events": True,
                "endpoint": "tcp://[::]:7001",
                "replay_endpoint": "ipc:///run/r",
            },
            EventEndpoints("tcp://[::1]:7001", "ipc:///run/r"),
        ),
        (  # vLLM's default endpoint; a named host is kept
            {"enable_kv_cache_events": True, "publisher": "zmq", "replay_endpoint": "tcp://10.0.0.5:7002"},
            EventEndpoints("tcp://127.0.0.1:5557", "tcp://10.0.0.5:7002"),
        ),
        ({"enable_kv_cache_events": True, "endpoint": "tcp://*:7001"}, None),  # no replay socket
        ({"enable_kv_cache_events": False, "replay_endpoint": "tcp://*:7002"}, None),  # events off
        ({"enable_kv_cache_events": True, "publisher": "null", "replay_endpoint": "tcp://*:7002"}, None),
    ],
)
def test_a_users_kv_events_config_is_read_as_a_subscriber_connects(config: dict, expected: Any) -> None:
    assert user_endpoints(config) == expected
    from vllm.config.kv_events import KVEventsConfig

    assert user_endpoints(KVEventsConfig(**config)) == expected  # vLLM's own config object reads the same


def test_counts_from_a_users_kv_events_config_on_tcp(decode: Any) -> None:
    """A user's config (TCP bound on every interface, a topic of its own, as one that also feeds an
    external indexer sets it) is counted from, batches sent before the subscription included."""
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
        "topic": "kv-events",
    }
    where = user_endpoints(config)
    assert where is not None
    bound = EventEndpoints(config["endpoint"], config["replay_endpoint"])
    publisher = Publisher(bound, topic=config["topic"], probe_at=where.publish)
    try:
        publisher.publish(publisher.stored(1, 2))
        publisher.flushed()
        blocks = CachedBlocks(where, decode, "tiny-model")
        try:
            publisher.publish(publisher.stored(3))
            counted(blocks, publisher.sent)
            assert blocks.count() == 3 and blocks.replayed >= 1
        finally:
            blocks.close()
    finally:
        publisher.close()
