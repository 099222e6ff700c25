"""The ``llmfleet`` CLI: submit (against the fake scheduler), status (collection + rendering), up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from llmfleet.cli import up, up_plan
from llmfleet.cli.main import main
from llmfleet.cli.status import KV, ClusterStatus, collect_status, render_status
from llmfleet.cli.up_security import security_env
from llmfleet.client.testing import FakeScheduler, FakeSchedulerThread, Fault, fake_completion
from llmfleet.config import DEFAULT_CONFIG, ClusterConfig
from llmfleet.coord.keys import Keys
from llmfleet.spec.services import ServiceSpec
from llmfleet.supervisor import free_port
from llmfleet.types import DesiredPlacement, ModelSpec, NodeRecord, Slo
from rich.console import Console

HERE = Path(__file__).parent
REPO = HERE.parents[2]


@pytest.fixture
def scheduler() -> Iterator[FakeSchedulerThread]:
    with FakeSchedulerThread(FakeScheduler(faults=[Fault(attempt=1, after_chunks=2)])) as srv:
        yield srv


def completion_text(prompt: str, n: int) -> str:
    return "".join(t for _, t in fake_completion(prompt, n))


# -- submit ----------------------------------------------------------------------------------------------
def test_submit_streams_text_and_usage(scheduler: FakeSchedulerThread, capsys: pytest.CaptureFixture) -> None:
    argv = ["submit", "hi there", "--service", "chat", "--scheduler", scheduler.address, "--max-tokens", "5"]
    argv += ["--request-id", "cli-1", "--temperature", "0.7", "--seed", "3", "--stop", "zz", "--stop", "yy"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == completion_text("hi there", 5) + "\n"  # retried once, no duplicates
    assert "request cli-1 finished (length) on fake-engine" in err
    assert "2 prompt + 5 completion tokens" in err
    sp = scheduler.fake.submits[0].sampling
    assert list(sp.stop) == ["zz", "yy"] and sp.seed == 3 and len(scheduler.fake.submits) == 2


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--service", "nope"], 2, "NOT_FOUND: unknown service 'nope'"),
        (["--service", "chat", "--max-tokens", "0"], 2, "INVALID_ARGUMENT: max_tokens must be > 0, got 0"),
    ],
)
def test_submit_errors_exit_codes(
    scheduler: FakeSchedulerThread, capsys: pytest.CaptureFixture, extra: list[str], code: int, message: str
) -> None:
    assert main(["submit", "hi", "--scheduler", scheduler.address, *extra]) == code
    out, err = capsys.readouterr()
    assert message in err and out == ""


def test_submit_unavailable_exits_3(capsys: pytest.CaptureFixture) -> None:
    argv = ["submit", "hi", "--service", "chat", "--scheduler", f"127.0.0.1:{free_port()}", "--retries", "0"]
    assert main(argv) == 3
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_submit_deadline_exits_4(capsys: pytest.CaptureFixture) -> None:
    with FakeSchedulerThread(FakeScheduler(token_delay_s=0.5)) as srv:
        assert main(["submit", "hi", "-s", "chat", "--scheduler", srv.address, "--timeout", "0.2"]) == 4
    assert "DEADLINE_EXCEEDED" in capsys.readouterr().err


def llmfleet_argv() -> list[str]:
    exe = Path(sys.executable).parent / "llmfleet"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "llmfleet.cli.main"]


def test_submit_console_script_reads_stdin(scheduler: FakeSchedulerThread) -> None:
    r = subprocess.run(
        [
            *llmfleet_argv(),
            "submit",
            "-",
            "--service",
            "summarize",
            "--scheduler",
            scheduler.address,
            "--max-tokens",
            "3",
        ],
        input="from stdin",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == completion_text("from stdin", 3) + "\n"
    assert "finished (length)" in r.stderr


def test_submit_ctrl_c_cancels_the_request() -> None:
    fake = FakeScheduler(token_delay_s=0.1)
    with FakeSchedulerThread(fake) as srv:
        proc = subprocess.Popen(
            [
                *llmfleet_argv(),
                "submit",
                "go",
                "-s",
                "chat",
                "--scheduler",
                srv.address,
                "--max-tokens",
                "500",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.read(4)  # streaming has started
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert "interrupted" in err
        deadline = time.monotonic() + 5
        while not fake.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.cancelled == {fake.submits[0].request_id}


# -- status ----------------------------------------------------------------------------------------------
class DictSource:
    """A StatusSource over a dict key -> (value, lease)."""

    def __init__(self, data: dict[str, tuple[bytes, int]], ttls: dict[int, int]) -> None:
        self.data, self.ttls = data, ttls

    async def range(self, prefix: str, leases: bool = False) -> list[KV]:
        return [
            KV(k, v, lease if leases else 0)
            for k, (v, lease) in sorted(self.data.items())
            if k.startswith(prefix)
        ]

    async def lease_ttl(self, lease_id: int) -> int:
        return self.ttls.get(lease_id, -1)


def sample_cluster(keys: Keys) -> dict[str, tuple[bytes, int]]:
    llama, qwen = ModelSpec("tiny-llama", "tiny://llama"), ModelSpec("tiny-qwen2", "tiny://qwen2")
    return {
        keys.node("engine-0"): (
            NodeRecord(
                "engine-0", "engine", "127.0.0.1:50061", "cpu", models=("tiny-llama",), pid=11
            ).to_json(),
            0x10,
        ),
        keys.node("engine-1"): (NodeRecord("engine-1", "engine", "127.0.0.1:50062").to_json(), 0x20),
        keys.node("scheduler"): (NodeRecord("scheduler", "scheduler", "127.0.0.1:50051").to_json(), 0x30),
        keys.node("broken"): (b"{not json", 0),
        keys.service("chat"): (ServiceSpec("chat", "tiny-llama", Slo(2.0, 0.2), priority=1).to_json(), 0),
        keys.placement("engine-0"): (DesiredPlacement("engine-0", (llama, qwen)).to_json(), 0),
        keys.placement("engine-1"): (DesiredPlacement("engine-1", ()).to_json(), 0),
        keys.placement("engine-9"): (DesiredPlacement("engine-9", (llama,)).to_json(), 0),
        keys.leader("placement"): (b"placement", 0x40),
        "/other/nodes/x": (b"{}", 0),
    }


async def test_collect_status_from_any_source() -> None:
    keys = Keys("/llmfleet")
    status = await collect_status(DictSource(sample_cluster(keys), {0x10: 7, 0x30: 9}), keys, etcd="e:1")
    d = status.to_dict()
    nodes = {n["node_id"]: n for n in d["nodes"]}
    assert sorted(nodes) == ["broken", "engine-0", "engine-1", "scheduler"]
    assert nodes["engine-0"]["models"] == ["tiny-llama"] and nodes["engine-0"]["lease_id"] == 0x10
    assert nodes["engine-0"]["lease_ttl_s"] == 7 and nodes["engine-1"]["lease_ttl_s"] == -1
    assert nodes["broken"]["error"].startswith("bad node record") and nodes["broken"]["lease_ttl_s"] is None
    assert d["services"] == [
        {
            "name": "chat",
            "model": "tiny-llama",
            "ttft_slo_s": 2.0,
            "tpot_slo_s": 0.2,
            "priority": 1,
            "max_tokens": 64,
            "error": None,
        }
    ]
    place = {p["engine_id"]: p for p in d["placements"]}
    assert place["engine-0"]["desired"] == ["tiny-llama", "tiny-qwen2"] and not place["engine-0"]["in_sync"]
    assert place["engine-1"] == {
        "engine_id": "engine-1",
        "desired": [],
        "loaded": [],
        "in_sync": True,
        "error": None,
    }
    assert place["engine-9"]["loaded"] is None
    assert d["leaders"] == [{"role": "placement", "leader": "placement"}]
    json.dumps(d)  # serialisable

    console = Console(record=True, width=200)
    render_status(status, console)
    text = console.export_text()
    for needle in ("engine-0", "tiny-qwen2", "reconciling", "in sync", "engine not registered", "placement"):
        assert needle in text
    render_status(ClusterStatus(prefix="/x"), Console(record=True))  # empty cluster renders too


async def test_status_json_against_real_etcd(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from llmfleet.config import EtcdSettings
    from llmfleet.coord.client import EtcdClient
    from llmfleet.coord.local_etcd import LocalEtcd

    with LocalEtcd(tmp_path / "etcd") as etcd:
        client = EtcdClient(EtcdSettings(endpoints=[etcd.endpoint], prefix="/t"))
        await client.connect(wait=False)
        lease = await client.grant(30)
        for key, (value, lease_id) in sample_cluster(client.keys).items():
            await client.put(key, value, lease=lease if lease_id else None)
        await client.close()
        code = await asyncio.to_thread(main, ["status", "--etcd", etcd.endpoint, "--prefix", "/t", "--json"])
        assert code == 0
        d = json.loads(capsys.readouterr().out)
        nodes = {n["node_id"]: n for n in d["nodes"]}
        assert nodes["engine-0"]["lease_id"] == lease and 0 < nodes["engine-0"]["lease_ttl_s"] <= 30
        assert [s["name"] for s in d["services"]] == ["chat"]
        assert d["leaders"][0]["leader"] == "placement" and d["etcd"] == etcd.endpoint
        code = await asyncio.to_thread(main, ["status", "--etcd", etcd.endpoint, "--prefix", "/t"])
        assert code == 0 and "engine-0" in capsys.readouterr().out
    code = await asyncio.to_thread(main, ["status", "--etcd", f"127.0.0.1:{free_port()}", "--timeout", "1"])
    assert code == 3 and "cannot read cluster status" in capsys.readouterr().err


# -- up --------------------------------------------------------------------------------------------------
def test_plan_services_from_default_config(tmp_path: Path) -> None:
    cfg = ClusterConfig.load(REPO / DEFAULT_CONFIG)
    plans = up.plan_services(cfg, "c.yaml", etcd="127.0.0.1:2379", state_dir=tmp_path, base_port=7000, ttl=5)
    assert [p.name for p in plans] == [
        "scheduler",
        "profiler",
        "placement",
        "migration",
        "engine-0",
        "engine-1",
        "engine-2",
    ]
    assert [p.address for p in plans] == [
        f"127.0.0.1:{p}" for p in (7000, 7001, 7002, 7003, 7010, 7011, 7012)
    ]
    sched = plans[0].argv
    assert sched[0].endswith("llmfleet-scheduler") or "llmfleet_scheduler" in sched[-1]
    i = sched.index("--etcd")
    assert sched[i + 1] == "127.0.0.1:2379" and sched[sched.index("--ttl") + 1] == "5"
    assert sched[sched.index("--id") + 1] == "scheduler" and "--prefix" not in sched
    assert plans[2].argv[-2:] == ["--config", "c.yaml"]
    threads = str(up.cpu_threads_each(cfg))  # the host's cores shared among the CPU engines
    preemption = up_plan.preemption_args(cfg)  # the scheduler section's rule, for the engine's core
    assert preemption[:2] == ["--preemption-priority", "--preemption-fairness"]
    assert plans[4].argv[-10 - len(preemption) :] == [
        "--models-dir",
        str(tmp_path / "models"),
        "--device",
        "cpu",
        "--policy",
        "fcfs",
        "--stream-interval-s",
        "0.0",
        *preemption,
        "--threads",
        threads,
    ]
    assert plans[4].log_path == tmp_path / "logs" / "engine-0.log"
    cfg.engines["engine-1"].port = 7002
    with pytest.raises(ValueError, match="port 7002 is already used"):
        up.plan_services(cfg, "c.yaml", etcd="e:1", state_dir=tmp_path, base_port=7000)


def test_plan_services_passes_engine_policy_options_and_limits(tmp_path: Path) -> None:
    cfg = ClusterConfig.model_validate({
        "services": {"chat": {"model": "m"}},
        "models": {"m": {"source": "tiny://llama"}},
        "engines": {
            "e0": {"models": ["m"], "policy": "scls", "options": {"slice_end": "recompute"},
                   "max_running": 8, "max_prefill_tokens": 1024, "watermark": 0.05},
            "e1": {"models": ["m"]},
        },
    })  # fmt: skip
    e0, e1 = up.plan_services(cfg, "c.yaml", etcd="e:1", state_dir=tmp_path, base_port=7000)[4:]
    assert e0.argv[e0.argv.index("--policy") :] == [
        "--policy", "scls", "--policy-options", '{"slice_end": "recompute"}',
        "--max-running", "8", "--max-prefill-tokens", "1024", "--watermark", "0.05",
        "--stream-interval-s", "0.0", *up_plan.preemption_args(cfg), "--threads", str(up.cpu_threads_each(cfg)),
    ]  # fmt: skip
    # nothing set: the spec's defaults, the engine's own limits
    n = len(up_plan.preemption_args(cfg))
    assert e1.argv[-6 - n : -2 - n] == ["--policy", "fcfs", "--stream-interval-s", "0.0"]


def test_plan_services_scheduler_replicas(tmp_path: Path) -> None:
    cfg = ClusterConfig.load(REPO / DEFAULT_CONFIG)
    plans = up.plan_services(
        cfg, "c.yaml", etcd="e:1", state_dir=tmp_path, base_port=7000, http_port=8000, schedulers=3
    )
    sched = [p for p in plans if p.name.startswith("scheduler")]
    assert [p.name for p in plans[:4]] == ["scheduler", "scheduler-1", "scheduler-2", "profiler"]
    assert [p.address for p in sched] == ["127.0.0.1:7000", "127.0.0.1:7005", "127.0.0.1:7006"]
    assert [p.http for p in sched] == ["127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"]
    assert all("--http-port" in p.argv for p in sched) and "--id" in sched[1].argv
    assert sched[1].argv[sched[1].argv.index("--id") + 1] == "scheduler-1"


def test_plan_services_api_keys_and_reseed(tmp_path: Path) -> None:
    cfg = ClusterConfig.load(REPO / DEFAULT_CONFIG)
    plans = up.plan_services(
        cfg, "c.yaml", etcd="e:1", state_dir=tmp_path, base_port=7000, api_keys="/k.yaml", reseed=True
    )
    by = {p.name: p.argv for p in plans}
    assert by["scheduler"][by["scheduler"].index("--api-keys") + 1] == "/k.yaml"
    assert "--reseed" in by["placement"]
    assert all("--api-keys" not in argv for name, argv in by.items() if name != "scheduler")


def test_up_tls_env_makes_a_ca_once_and_checks_the_keys_file(tmp_path: Path) -> None:
    import argparse

    from llmfleet.security import ApiKeyError, configure

    previous = configure(None)
    try:
        args = argparse.Namespace(tls=True, api_keys=None, host="0.0.0.0")
        env = security_env(args, tmp_path)
        assert env["LLMFLEET_TLS_CLIENT_AUTH"] == "1" and env["LLMFLEET_TLS_CA"] == str(
            tmp_path / "tls" / "ca.pem"
        )
        ca = (tmp_path / "tls" / "ca.pem").read_bytes()
        assert security_env(args, tmp_path) == env and (tmp_path / "tls" / "ca.pem").read_bytes() == ca
        shell = (tmp_path / "tls" / "env").read_text()
        assert "export LLMFLEET_TLS_CERT=" in shell and "CLIENT_AUTH" not in shell
        bad = tmp_path / "keys.yaml"
        bad.write_text("keys: []\n")
        with pytest.raises(ApiKeyError, match="keys"):
            security_env(argparse.Namespace(tls=False, api_keys=str(bad), host="127.0.0.1"), tmp_path)
    finally:
        configure(previous)


def test_up_starts_supervises_and_stops_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, gone: Callable[..., bool]
) -> None:
    """``up`` with stand-in services (the health helper), a real local etcd and Ctrl-C at the end."""
    monkeypatch.setattr(  # plan_services (llmfleet.cli.up_plan) looks the command up there
        up_plan, "service_command", lambda script, module: [sys.executable, str(HERE / "health_child.py")]
    )
    state = tmp_path / "state"
    base = free_port()
    while any(not _port_free(base + off) for off in (0, 1, 2, 3, 4, 5, 10, 11)):
        base = free_port()
    result: dict[str, object] = {}

    def driver() -> None:  # the "user": waits for the cluster, kills one child, then presses Ctrl-C
        endpoints = state / "endpoints.json"
        deadline = time.monotonic() + 60
        while not endpoints.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            info = json.loads(endpoints.read_text())
            result["info"] = info
            os.kill(info["engine-1"]["pid"], signal.SIGKILL)
            while time.monotonic() < deadline:  # up restarts it (backoff 0.2 s) and says so in endpoints
                after = json.loads(endpoints.read_text())
                if after["engine-1"]["pid"] != info["engine-1"]["pid"]:
                    result["after"] = after
                    break
                time.sleep(0.1)
            time.sleep(1.0)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=driver, daemon=True)
    t.start()
    argv = ["up", "--config", str(REPO / DEFAULT_CONFIG), "--state-dir", str(state), "--etcd-port", "0"]
    code = main(
        [
            *argv,
            "--base-port",
            str(base),
            "--health-timeout",
            "60",
            "--grace",
            "5",
            "--restart-backoff-s",
            "0.2",
        ]
    )
    t.join(10)
    out = capsys.readouterr().out
    assert code == 0, out
    info = result["info"]
    assert isinstance(info, dict)
    assert sorted(info) == sorted(
        [
            "etcd",
            "scheduler",
            "scheduler-1",
            "profiler",
            "placement",
            "migration",
            "front",
            "engine-0",
            "engine-1",
            "engine-2",
        ]
    )
    assert all(r["status"] == "healthy" for r in info.values()), info
    assert info["front"]["address"] == f"127.0.0.1:{base + 4}"  # the OpenAI front
    assert info["scheduler"]["address"] == f"127.0.0.1:{base}" and info["engine-0"]["address"].endswith(
        str(base + 10)
    )
    assert info["scheduler-1"]["address"] == f"127.0.0.1:{base + 5}"  # the second replica
    assert "llmfleet is up" in out and "warning:" in out and "engine-1" in out and "signal SIGKILL" in out
    assert "restart 1 in 0.2s" in out and "restarted engine-1" in out
    after = result["after"]
    assert after["engine-1"]["status"] == "restarted" and after["engine-1"]["restarts"] == 1
    assert "stopped" in out
    assert all(gone(r["pid"]) for r in [*info.values(), after["engine-1"]]), "a child outlived `llmfleet up`"
    assert (state / "logs" / "engine-1.log").read_text().count("starting engine-1") == 2  # one log, appended
    log = (state / "logs" / "engine-0.log").read_text()
    assert "engine-0: serving" in log and "engine-0: stopped" in log


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_restart_policy_backs_off_resets_and_gives_up() -> None:
    from llmfleet.supervisor_restart import RestartPolicy, Restarts

    r = Restarts(RestartPolicy(backoff_s=1.0, max_backoff_s=4.0, burst=4, interval_s=60.0, stable_s=30.0))
    assert r.on_exit("a", 0, 0.0, 5.0).restart_at is None  # a clean exit stays stopped
    waits = [r.on_exit("a", -9, t, 1.0) for t in (10.0, 12.0, 15.0)]
    assert [d.restart_at - t for d, t in zip(waits, (10.0, 12.0, 15.0), strict=True)] == [1.0, 2.0, 4.0]
    assert r.on_exit("b", 1, 15.0, 1.0).attempt == 1  # children are independent
    gave_up = r.on_exit("a", 1, 20.0, 1.0)  # the 4th failure within 60 s
    assert gave_up.gave_up and gave_up.restart_at is None and "4 failures within 60s" in gave_up.reason
    fresh = Restarts(RestartPolicy(backoff_s=1.0, stable_s=30.0))
    fresh.on_exit("a", 1, 0.0, 1.0)
    fresh.on_exit("a", 1, 5.0, 1.0)
    assert fresh.on_exit("a", 1, 100.0, 90.0).restart_at == 101.0  # ran 90 s: the backoff starts over


def test_up_rejects_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("services: {a: {model: missing}}\nmodels: {}\n")
    assert main(["up", "--config", str(bad), "--state-dir", str(tmp_path / "s")]) == 2
    assert "unknown model 'missing'" in capsys.readouterr().out
    assert main(["up", "--config", str(tmp_path / "nope.yaml"), "--state-dir", str(tmp_path / "s")]) == 2


def test_grpc_status_codes_are_the_documented_exit_codes() -> None:
    from llmfleet.cli.submit import EXIT_CODES

    assert EXIT_CODES[grpc.StatusCode.NOT_FOUND] == 2 and EXIT_CODES[grpc.StatusCode.UNAVAILABLE] == 3
