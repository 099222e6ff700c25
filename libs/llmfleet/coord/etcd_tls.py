"""An ``aetcd.Client`` over TLS (aetcd opens only plaintext channels), with etcd's user/password
authentication as aetcd does it (an ``Authenticate`` token sent as ``token`` metadata)."""

from __future__ import annotations

import aetcd
import grpc
from aetcd import rpc, watcher

from llmfleet.config import EtcdSettings


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def etcd_credentials(s: EtcdSettings) -> grpc.ChannelCredentials:
    """The CA verifying etcd's certificate (system roots when unset) and our client certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(s.ca_cert), private_key=_read(s.key), certificate_chain=_read(s.cert)
    )


class SecureEtcdClient(aetcd.Client):
    """``aetcd.Client`` whose channel is ``grpc.aio.secure_channel`` with ``credentials``."""

    def __init__(self, *args, credentials: grpc.ChannelCredentials, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        channel = grpc.aio.secure_channel(
            f"{self._host}:{self._port}", self._credentials, options=list(self._options.items())
        )
        try:
            metadata = None
            if self._username is not None and self._password is not None:
                resp = await rpc.AuthStub(channel).Authenticate(
                    rpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self._timeout,
                )
                metadata = (("token", resp.token),)
        except rpc.AioRpcError:
            await channel.close()
            raise  # as is: llmfleet.coord.etcd_errors classifies an error by the gRPC error behind it
        self.channel, self.metadata = channel, metadata
        self.kvstub = rpc.KVStub(channel)
        self.clusterstub = rpc.ClusterStub(channel)
        self.leasestub = rpc.LeaseStub(channel)
        self.maintenancestub = rpc.MaintenanceStub(channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(channel), timeout=self._timeout, metadata=metadata)
        self._connected.set()


def new_aetcd_client(s: EtcdSettings, host: str, port: int, options: dict) -> aetcd.Client:
    """A plaintext ``aetcd.Client`` or, when ``s.tls``, a :class:`SecureEtcdClient`."""
    auth = {"username": s.username, "password": s.password}
    if not s.tls:
        return aetcd.Client(host=host, port=port, timeout=None, options=options, **auth)
    return SecureEtcdClient(
        host=host, port=port, timeout=None, options=options, credentials=etcd_credentials(s), **auth
    )
