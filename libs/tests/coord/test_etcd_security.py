"""The etcd client over TLS (client certificates) and with etcd's user/password auth, on a real etcd."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmfleet.config import EtcdSettings
from llmfleet.coord.client import EtcdClient, EtcdError
from llmfleet.coord.local_etcd import EtcdServerTls, LocalEtcd
from llmfleet.security.certs import write_dev_certs


async def roundtrip(settings: EtcdSettings) -> bytes | None:
    client = EtcdClient(settings)
    try:
        await client.connect(wait=False)
        await client.put("/sec/k", b"v")
        return await client.get("/sec/k")
    finally:
        await client.close()


async def test_tls_with_client_certificates(tmp_path: Path):
    server = write_dev_certs(tmp_path / "tls", ["127.0.0.1", "localhost"])
    client = write_dev_certs(tmp_path / "tls", ["llmfleet-client"], name="client")
    tls = EtcdServerTls(str(server.cert), str(server.key), str(server.ca))
    etcd = LocalEtcd(tmp_path / "etcd", tls=tls).start()
    try:
        assert etcd.client_url.startswith("https://")
        good = EtcdSettings(
            endpoints=[etcd.endpoint], ca_cert=str(server.ca), cert=str(client.cert), key=str(client.key)
        )
        assert await roundtrip(good) == b"v"
        assert "/sec/k" in etcd.ctl("get", "/sec/k")  # etcdctl over TLS sees the write
        with pytest.raises(EtcdError):  # plaintext against an https etcd
            await roundtrip(EtcdSettings(endpoints=[etcd.endpoint], timeout_s=2))
        with pytest.raises(EtcdError):  # TLS without the client certificate etcd requires
            await roundtrip(EtcdSettings(endpoints=[etcd.endpoint], ca_cert=str(server.ca), timeout_s=2))
    finally:
        etcd.stop()


async def test_user_and_password(etcd: LocalEtcd, monkeypatch):
    etcd.ctl("user", "add", "root", "--new-user-password=s3cret-pw")
    etcd.ctl("auth", "enable")
    good = EtcdSettings(endpoints=[etcd.endpoint], username="root", password="s3cret-pw")
    assert await roundtrip(good) == b"v"
    with pytest.raises(Exception, match=r"(?i)user name|permission|auth"):
        await roundtrip(EtcdSettings(endpoints=[etcd.endpoint], timeout_s=2))
    with pytest.raises(Exception, match=r"(?i)authentication failed|invalid|auth"):
        await roundtrip(
            EtcdSettings(endpoints=[etcd.endpoint], username="root", password="wrong", timeout_s=2)
        )
    monkeypatch.setenv("LLMFLEET_ETCD_USER", "root")
    monkeypatch.setenv("LLMFLEET_ETCD_PASSWORD", "s3cret-pw")
    assert await roundtrip(EtcdSettings.from_env(endpoints=etcd.endpoint)) == b"v"
    monkeypatch.delenv("LLMFLEET_ETCD_PASSWORD")
    with pytest.raises(ValueError, match="etcd-user: needs a password"):
        EtcdSettings.from_env(endpoints=etcd.endpoint)
