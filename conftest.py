"""Shared pytest fixtures (repo root): a real etcd per test and settings pointing at it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from llmfleet.config import EtcdSettings
from llmfleet.coord.client import EtcdClient
from llmfleet.coord.local_etcd import LocalEtcd


@pytest.fixture(autouse=True)
def _no_tracing_after() -> Iterator[None]:
    """A test that installs a TracerProvider uninstalls it when it ends, so later tests record no
    spans."""
    yield
    from llmfleet.telemetry import reset_tracing, tracing_enabled

    if tracing_enabled():
        reset_tracing()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """A fresh single-node etcd (real binary) on free ports, data in tmp_path; stopped afterwards."""
    server = LocalEtcd(tmp_path / "etcd").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_settings(etcd: LocalEtcd) -> EtcdSettings:
    """Settings for ``etcd`` with a unique key prefix and a short lease TTL (2 s)."""
    return EtcdSettings(endpoints=[etcd.endpoint], prefix=f"/test-{uuid.uuid4().hex[:8]}", lease_ttl_s=2)


@pytest.fixture
async def etcd_client(etcd_settings: EtcdSettings) -> AsyncIterator[EtcdClient]:
    """A connected EtcdClient for ``etcd_settings``; closed afterwards. It retries for up to 30 s: on a
    loaded machine the first probe of a just-started etcd can miss its 2 s timeout."""
    client = EtcdClient(etcd_settings)
    async with asyncio.timeout(30):
        await client.connect()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def node_args(etcd_settings: EtcdSettings) -> list[str]:
    """Common flags for building a service in-process (``main.build_parser().parse_args([...])``) against
    ``etcd_settings``, on any free port."""
    return [
        "--etcd",
        etcd_settings.endpoints[0],
        "--prefix",
        etcd_settings.prefix,
        "--ttl",
        "2",
        "--port",
        "0",
    ]
