"""llmfleet.supervisor: spawn, health-wait, stop order, SIGKILL escalation, no orphans."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from llmfleet.supervisor import ChildExited, HealthTimeout, ProcessGroup, describe_returncode, free_port, tail

HERE = Path(__file__).parent
HEALTH_CHILD = str(HERE / "health_child.py")


def health_child(name: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, HEALTH_CHILD, "--id", name, "--port", str(port), *extra]


def test_spawn_wait_healthy_stop_all(tmp_path: Path, gone: Callable[..., bool]) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        port = free_port()
        child = group.spawn("svc", health_child("svc", port))
        group.wait_healthy(child, f"127.0.0.1:{port}", timeout=30)
        assert child.alive and group["svc"] is child and "svc" in group
        group.stop_all(grace=5)
        assert child.returncode == 0
    assert gone(child.pid)
    assert "svc: serving" in (tmp_path / "svc.log").read_text()
    assert "svc: stopped" in child.log_tail()


def test_child_exiting_early_fails_fast_with_log_tail(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        port = free_port()
        child = group.spawn("bad", health_child("bad", port, "--exit-early", "3"))
        t0 = time.monotonic()
        with pytest.raises(ChildExited) as ei:
            group.wait_healthy("bad", f"127.0.0.1:{port}", timeout=60)
        assert time.monotonic() - t0 < 20
    err = ei.value
    assert err.returncode == 3 and err.child is child
    assert "boom: refusing to start" in str(err) and "boom" in err.log_tail
    assert "bad (pid" in str(err) and "code 3" in str(err)


def test_health_timeout_includes_log_tail(tmp_path: Path, gone: Callable[..., bool]) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        port = free_port()
        child = group.spawn("slow", health_child("slow", port, "--delay", "60"))
        with pytest.raises(HealthTimeout) as ei:
            group.wait_healthy(child, f"127.0.0.1:{port}", timeout=1.0)
        assert isinstance(ei.value, TimeoutError)
        assert "slow: starting" in str(ei.value) and "UNAVAILABLE" in str(ei.value)
    assert gone(child.pid)


def _three_children(tmp_path: Path, term_log: Path) -> tuple[ProcessGroup, list]:
    """Children a, b, c, healthy, logging each SIGTERM they get to ``term_log``; b ignores it."""
    group = ProcessGroup(log_dir=tmp_path)
    children = []
    for name in ("a", "b", "c"):
        port = free_port()
        extra = ["--term-log", str(term_log)] + (["--ignore-term"] if name == "b" else [])
        children.append(group.spawn(name, health_child(name, port, *extra)))
        group.wait_healthy(name, f"127.0.0.1:{port}", timeout=30)
    return group, children


def test_stop_all_reverse_order_and_sigkill_escalation(tmp_path: Path, gone: Callable[..., bool]) -> None:
    term_log = tmp_path / "terms.txt"
    group, children = _three_children(tmp_path, term_log)
    t0 = time.monotonic()
    group.stop_all(grace=0.5)
    assert time.monotonic() - t0 < 10
    assert term_log.read_text().split() == ["c", "b", "a"]
    assert [c.returncode for c in children] == [0, -signal.SIGKILL, 0]
    assert all(gone(c.pid) for c in children)


def test_stop_all_together_signals_every_child_without_waiting_for_a_slow_one(
    tmp_path: Path, gone: Callable[..., bool]
) -> None:
    term_log = tmp_path / "terms.txt"
    group, children = _three_children(tmp_path, term_log)
    stopper = threading.Thread(target=group.stop_all, kwargs={"grace": 12.0, "together": True})
    stopper.start()
    # one by one, "a" would get its SIGTERM only once "b" had ignored its own for the whole grace; the
    # children log their SIGTERM within the 10 s wait even on a loaded machine
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not (
        term_log.exists() and sorted(term_log.read_text().split()) == ["a", "b", "c"]
    ):
        time.sleep(0.05)
    assert sorted(term_log.read_text().split()) == ["a", "b", "c"]
    assert stopper.is_alive()  # still waiting out b's grace
    stopper.join(30)
    assert [c.returncode for c in children] == [0, -signal.SIGKILL, 0]
    assert all(gone(c.pid) for c in children)


def test_kill_poll_exited_and_restart(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        port = free_port()
        group.spawn("svc", health_child("svc", port))
        group.wait_healthy("svc", f"127.0.0.1:{port}", timeout=30)
        assert group.poll_exited() == []
        assert group.kill("svc") == -signal.SIGKILL
        exited = group.poll_exited()
        assert [c.name for c in exited] == ["svc"] and group.poll_exited() == []
        again = group.spawn("svc", health_child("svc", port))  # a name is reusable after exit
        group.wait_healthy(again, f"127.0.0.1:{port}", timeout=30)
        assert group["svc"] is again and len(group.children) == 1
        with pytest.raises(Exception, match="already running"):
            group.spawn("svc", health_child("svc", port))
        with pytest.raises(KeyError, match="no child named 'nope'"):
            group["nope"]
    assert not again.alive


def test_children_die_with_their_parent(tmp_path: Path, gone: Callable[..., bool]) -> None:
    parent = subprocess.Popen(
        [sys.executable, str(HERE / "pdeathsig_parent.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not gone(child_pid, within=0.2)
        parent.kill()  # no cleanup runs in the parent: only PR_SET_PDEATHSIG can stop the child
        parent.wait()
        assert gone(child_pid), f"child {child_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_spawn_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group, pytest.raises(Exception, match="cannot start x"):
        group.spawn("x", ["/nonexistent/binary"])


def test_helpers(tmp_path: Path) -> None:
    assert describe_returncode(0) == "code 0"
    assert describe_returncode(-9) == "signal SIGKILL"
    assert describe_returncode(None) == "still running"
    f = tmp_path / "log"
    f.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(f, 2) == "line 98\nline 99"
    assert tail(tmp_path / "missing") == "<no log>"
    assert 0 < free_port() < 65536
