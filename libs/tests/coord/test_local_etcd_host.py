"""LocalEtcd's ``host``: etcd listens on (and advertises) that address only; the default stays 127.0.0.1."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from llmfleet.coord.local_etcd import LocalEtcd

# every 127.0.0.0/8 address is local on Linux (macOS has only 127.0.0.1 by default)
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs 127.0.0.2 (Linux)")


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_default_host_is_loopback(tmp_path: Path) -> None:
    e = LocalEtcd(tmp_path / "etcd")
    assert e.host == "127.0.0.1"
    assert e.endpoint == f"127.0.0.1:{e.client_port}"
    assert e.client_url == f"http://127.0.0.1:{e.client_port}"


def test_binds_and_advertises_the_given_host(tmp_path: Path) -> None:
    with LocalEtcd(tmp_path / "etcd", host="127.0.0.2") as e:
        assert e.endpoint == f"127.0.0.2:{e.client_port}"
        assert e.healthy()
        e.ctl("put", "/k", "v")
        assert e.ctl("get", "/k", "--print-value-only").strip() == "v"
        assert _connects("127.0.0.2", e.client_port)
        assert not _connects("127.0.0.1", e.client_port)  # listens on 127.0.0.2 only
        members = e.ctl("member", "list")
        assert f"http://127.0.0.2:{e.peer_port}" in members
        assert f"http://127.0.0.2:{e.client_port}" in members


@pytest.mark.parametrize("host", ["0.0.0.0", ""])
def test_refuses_a_wildcard_host(tmp_path: Path, host: str) -> None:
    with pytest.raises(ValueError, match="reach"):
        LocalEtcd(tmp_path / "etcd", host=host)
