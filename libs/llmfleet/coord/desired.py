"""Desired-state helpers: write/delete ``services/`` and ``placement/`` keys, and typed views of them."""

from __future__ import annotations

from llmfleet.coord.client import EtcdClient
from llmfleet.coord.view import PrefixView
from llmfleet.types import DesiredPlacement, NodeRecord, ServiceSpec


async def put_placement(client: EtcdClient, placement: DesiredPlacement) -> None:
    await client.put(client.keys.placement(placement.engine_id), placement.to_json())


async def delete_placement(client: EtcdClient, engine_id: str) -> bool:
    return await client.delete(client.keys.placement(engine_id))


async def put_service(client: EtcdClient, spec: ServiceSpec) -> None:
    await client.put(client.keys.service(spec.name), spec.to_json())


async def delete_service(client: EtcdClient, name: str) -> bool:
    return await client.delete(client.keys.service(name))


def placement_view(client: EtcdClient) -> PrefixView[DesiredPlacement]:
    """engine_id -> DesiredPlacement (call ``start()``)."""
    return PrefixView(client, client.keys.placements, DesiredPlacement.from_json)


def service_view(client: EtcdClient) -> PrefixView[ServiceSpec]:
    """service name -> ServiceSpec (call ``start()``)."""
    return PrefixView(client, client.keys.services, ServiceSpec.from_json)


def node_view(client: EtcdClient) -> PrefixView[NodeRecord]:
    """node id -> NodeRecord of every live node (call ``start()``)."""
    return PrefixView(client, client.keys.nodes, NodeRecord.from_json)
