"""What the etcd client returns: a key's full record (:class:`KeyValue`) and one watched change
(:class:`WatchEvent`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from aetcd import rpc


class WatchEvent(NamedTuple):
    """One change: ``kind`` is 'put' or 'delete'; for deletes ``value`` is b""."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True)
class KeyValue:
    """A key's full record as etcd stores it (``lease`` is 0 when unbound)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_proto(cls, kv: rpc.KeyValue) -> KeyValue:
        return cls(
            key=kv.key.decode(),
            value=bytes(kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease,
        )
