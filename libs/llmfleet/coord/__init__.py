"""etcd coordination: client, lease-bound registration, prefix views, leader election, desired state."""

from llmfleet.coord.client import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseNotFound,
    WatchEvent,
    WatchInterrupted,
)
from llmfleet.coord.desired import (
    delete_placement,
    delete_service,
    node_view,
    placement_view,
    put_placement,
    put_service,
    service_view,
)
from llmfleet.coord.election import LeaderElection
from llmfleet.coord.keys import Keys
from llmfleet.coord.local_etcd import LocalEtcd
from llmfleet.coord.registration import Registration
from llmfleet.coord.view import PrefixView

__all__ = [
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "Keys",
    "LeaderElection",
    "LeaseNotFound",
    "LocalEtcd",
    "PrefixView",
    "Registration",
    "WatchEvent",
    "WatchInterrupted",
    "delete_placement",
    "delete_service",
    "node_view",
    "placement_view",
    "put_placement",
    "put_service",
    "service_view",
]
