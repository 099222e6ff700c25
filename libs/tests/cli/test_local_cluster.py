"""``llmfleet.cli.local_cluster``: the benchmarks' throwaway cluster passes ``http_port`` on to the plan
(off by default, a free port for 0) and reports the scheduler's HTTP address."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from llmfleet.cli import local_cluster as lc


class _Etcd:
    endpoint = "127.0.0.1:2379"

    def start(self) -> _Etcd:
        return self

    def stop(self) -> None: ...


class _Group:
    def __init__(self, _logs: Path) -> None:
        self.spawned: dict[str, list[str]] = {}

    def spawn(self, name: str, argv: list[str], log_path: Path) -> None:
        self.spawned[name] = argv

    def wait_healthy(self, *_a, **_k) -> None: ...

    def stop_all(self, grace: float) -> None: ...


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(lc, "LocalEtcd", lambda _dir: _Etcd())
    monkeypatch.setattr(lc, "ProcessGroup", _Group)
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "services: {s: {model: m}}\nmodels: {m: {source: 'tiny://llama'}}\nengines: {e0: {models: [m]}}\n"
    )
    return path


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_http_off_by_default(config: Path, tmp_path: Path) -> None:
    cluster = lc.start_local_cluster(config, tmp_path)
    assert _flag(cluster.group.spawned["scheduler"], "--http-port") == "-1"
    assert cluster.http == ""


def test_http_port_zero_picks_a_free_port(config: Path, tmp_path: Path) -> None:
    cluster = lc.start_local_cluster(config, tmp_path, http_port=0)
    port = int(_flag(cluster.group.spawned["scheduler"], "--http-port"))
    assert port > 0 and cluster.http == f"127.0.0.1:{port}"
    with socket.socket() as sock:  # still free for the scheduler to bind
        sock.bind(("127.0.0.1", port))
    assert "--http-port" not in cluster.group.spawned["e0"]


def test_http_port_given(config: Path, tmp_path: Path) -> None:
    port = lc.free_port()
    cluster = lc.start_local_cluster(config, tmp_path, http_port=port)
    assert cluster.http == f"127.0.0.1:{port}"
