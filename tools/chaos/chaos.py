"""``make chaos``: kill, freeze and cut parts of a live local cluster under steady streaming load, and
count what the clients saw.

The cluster is the one ``llmfleet up`` plans (``llmfleet.cli.up.plan_services``: etcd, two scheduler
replicas with their OpenAI-compatible HTTP APIs, profiler, placement, migration, engines), plus a
standby placement and migration replica (``placement-1``, ``migration-1``) so that killing a leader
tests the election. Every engine hosts the tiny llama **without EOS** (each request generates exactly
``max_tokens``), greedy, so every output is checked against a reference computed once per
(prompt, length) before the load starts.

Load: ``--concurrency`` closed-loop workers, half through the SDK (``AsyncClient`` given both
replicas, half of them in each order, so both replicas carry live streams), half through the HTTP
API (``POST /v1/completions`` with ``stream: true``, alternating between the two replicas' ports).
An HTTP stream cut by a replica's death cannot resume: the worker retries the request on the other
replica (counted as a retry; it is an error only when its retries run out).

Faults (``--faults``, in order; each: inject, wait, heal, wait until the cluster is whole again, settle):

===================  =====================================================================================
``engine``           kill -9 ``engine-0``; restarted after ``--restart-delay-s`` (``up``'s first backoff)
``scheduler``        kill -9 the replica ``scheduler``; restarted likewise
``profiler``         kill -9 the profiler; restarted likewise
``placement-leader`` kill -9 whichever placement replica holds ``leaders/placement``; restarted
``migration-leader`` kill -9 whichever migration replica holds ``leaders/migration``; restarted
``etcd-kill``        kill -9 etcd; restarted from its data dir after ``--restart-delay-s``
``etcd-freeze``      SIGSTOP etcd for 1.5 lease TTLs, then SIGCONT (every lease expires meanwhile)
``engine-freeze``    "cut one engine off the network", approximated by SIGSTOP of ``engine-1`` for 1.5
                     TTLs (a frozen host: its sockets stay open but nothing answers), then SIGCONT
===================  =====================================================================================

"Whole again": every process is registered under etcd ``nodes/`` with a live lease, placement and
migration each have a leader, and both scheduler replicas route the service to every engine (gRPC
``ListServices``) and answer HTTP ``/health``.

Per fault (requests are attributed to the phase they started in): requests started / completed /
lost (no outcome by the end of the drain, or a stream that ended without its final chunk),
duplicated / gapped / wrong tokens (SDK: chunk indices and token ids against the reference; HTTP: the
text against the reference text and ``usage.completion_tokens``), client-visible errors (after the
SDK's own retries; HTTP after ``--http-retries``), retries (SDK: attempts - 1), the recovery time
(inject -> whole, heal -> whole) and the longest stall of the token flow (no token reached any
client). Writes ``chaos.json`` and ``chaos.md`` to ``--out`` (default ``.bench/chaos``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import platform
import random
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.ports import free_port

log = logging.getLogger("chaos")

SERVICE = "chat"
MODEL = "tiny-llama"
ALL_FAULTS = (
    "engine",
    "scheduler",
    "profiler",
    "placement-leader",
    "migration-leader",
    "etcd-kill",
    "etcd-freeze",
    "engine-freeze",
)
PROMPTS = (
    "Once upon a time there was a tiny model",
    "The fleet keeps going when a node dies",
    "Leases expire and leaders step down",
    "A scheduler replica fails over",
    "Greedy decoding is deterministic",
    "Chaos engineering on two cores",
    "Engines resume from delivered tokens",
    "etcd holds the truth of the cluster",
)
LENGTHS = (8, 16, 32, 64)


# -- the cluster -----------------------------------------------------------------------------------------
def _free_port_pair() -> int:
    """A port p with p and p + 1 free (``up`` puts scheduler-1's HTTP API on the scheduler's + 1)."""
    for _ in range(200):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no pair of free ports found")


def _rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB from /proc (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (e.g. a console-script wrapper's child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for t in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (t / "children").read_text().split()]
    return out


def _retarget(argv: list[str], node_id: str, port: int) -> list[str]:
    """A replica's command line: ``argv`` with another ``--id``, ``--port`` and ``--metrics-port``."""
    out = list(argv)
    for flag, value in (("--id", node_id), ("--port", str(port)), ("--metrics-port", str(free_port()))):
        i = out.index(flag)
        out[i + 1] = value
    return out


@dataclass
class Node:
    name: str
    argv: list[str]
    address: str
    log_path: Path
    http: str = ""


class ChaosCluster:
    """etcd + the children ``up`` plans (two scheduler replicas with HTTP), standby placement and
    migration replicas, ``engines`` engines hosting the endless tiny llama (static placement)."""

    def __init__(
        self,
        root: Path,
        *,
        engines: int = 2,
        ttl: int = 10,
        engine_threads: int = 1,
        scheduler_args: Sequence[str] = (),
        engine_args: Sequence[str] = (),
        default_max_tokens: int = 16,
    ) -> None:
        import yaml
        from llmfleet.cli.local_cluster import free_base_port
        from llmfleet.cli.up import plan_services
        from llmfleet.config import ClusterConfig
        from llmfleet.coord import LocalEtcd
        from llmfleet.supervisor import ProcessGroup
        from llmfleet_engine.models import materialize, without_eos

        self.root = root
        self.ttl = ttl
        self.prefix = f"/chaos-{uuid.uuid4().hex[:8]}"
        models_dir = root / "models"
        endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
        self.engine_ids = [f"engine-{i}" for i in range(engines)]
        config = {
            "services": {SERVICE: {"model": MODEL, "default_max_tokens": default_max_tokens}},
            "models": {MODEL: {"source": str(endless)}},
            "placement": {"policy": "static"},
            "engines": {e: {"models": [MODEL]} for e in self.engine_ids},
        }
        self.config_path = root / "cluster.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.etcd = LocalEtcd(root / "etcd")
        self.group = ProcessGroup(root / "logs")
        plans = plan_services(
            ClusterConfig.load(self.config_path),
            self.config_path,
            etcd="",  # filled in at start()
            state_dir=root,
            base_port=free_base_port(),
            prefix=self.prefix,
            ttl=ttl,
            log_level="WARNING",
            http_port=_free_port_pair(),
            schedulers=2,
        )
        self.nodes: dict[str, Node] = {}
        for p in plans:
            argv = list(p.argv)
            if p.name.startswith("scheduler"):
                argv += [*scheduler_args]
            if p.name in self.engine_ids:
                argv += ["--threads", str(engine_threads), "--offline", *engine_args]
            self.nodes[p.name] = Node(p.name, argv, p.address, p.log_path, p.http)
            if p.name in ("placement", "migration"):  # a standby replica: leader kills test the election
                port = free_port()
                name = f"{p.name}-1"
                self.nodes[name] = Node(
                    name,
                    _retarget(argv, name, port),
                    f"127.0.0.1:{port}",
                    p.log_path.with_name(f"{name}.log"),
                )
        self.schedulers = [n for n in self.nodes if n.startswith("scheduler")]
        self.unexpected_exits: list[str] = []

    # addresses
    @property
    def sdk_addresses(self) -> list[str]:
        return [self.nodes[s].address for s in self.schedulers]

    @property
    def http_addresses(self) -> list[str]:
        return [self.nodes[s].http for s in self.schedulers]

    def start(self, timeout_s: float = 240) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            i = node.argv.index("--etcd")
            node.argv[i + 1] = self.etcd.endpoint
            self.group.spawn(node.name, node.argv, log_path=node.log_path)
        for node in self.nodes.values():
            self.group.wait_healthy(node.name, node.address, timeout=timeout_s)

    def stop(self) -> None:
        for node in self.nodes.values():  # a frozen child would ignore SIGTERM for the whole grace
            if node.name in self.group and self.group[node.name].alive:
                self.group[node.name].signal(signal.SIGCONT)
        try:
            self.group.stop_all(grace=10)
        finally:
            self.etcd.stop()

    def pids(self) -> dict[str, int]:
        """The pid of every live process (etcd included)."""
        out = {c.name: c.pid for c in self.group.children if c.alive}
        if self.etcd.pid is not None:
            out["etcd"] = self.etcd.pid
        return out

    def rss_kib(self) -> dict[str, int]:
        """Resident memory of each process (its descendants included), KiB."""
        out = {}
        for name, pid in self.pids().items():
            values = [r for p in _tree_pids(pid) if (r := _rss_kib(p)) is not None]
            if values:
                out[name] = sum(values)
        return out

    # -- the state etcd and the schedulers report --------------------------------------------------------
    async def leader(self, role: str) -> str | None:
        with contextlib.suppress(Exception):
            status = await self.etcd_status(timeout_s=3.0)
            return next((r.leader for r in status.leaders if r.role == role), None)
        return None

    async def etcd_status(self, timeout_s: float = 2.0) -> Any:
        """What etcd says (nodes with their leases, leaders): ``llmfleet status`` without asking the
        placement and migration leaders, so a frozen process cannot stall the check."""
        from llmfleet.cli.status import EtcdStatusSource, collect_status
        from llmfleet.config import EtcdSettings
        from llmfleet.coord.client import EtcdClient

        settings = EtcdSettings.from_env(endpoints=self.etcd.endpoint, prefix=self.prefix)
        settings.timeout_s = timeout_s
        client = EtcdClient(settings)
        try:
            await asyncio.wait_for(client.connect(wait=False), timeout_s)
            return await asyncio.wait_for(
                collect_status(EtcdStatusSource(client), client.keys), 2 * timeout_s
            )
        finally:
            await client.close()

    async def whole(self) -> tuple[bool, str]:
        """(True, "") when every process is registered with a live lease, placement and migration have
        a leader and both schedulers route the service to every engine; else (False, what is missing)."""
        import httpx
        from llmfleet.client import AsyncClient

        try:
            status = await self.etcd_status()
        except Exception as e:
            return False, f"etcd: {type(e).__name__}"
        pids = self.pids()
        live = {  # a live lease held by the process running now (not one a killed process left behind)
            n.node_id
            for n in status.nodes
            if n.lease_ttl_s is not None
            and n.lease_ttl_s > 0
            and n.node_id in pids
            and (not n.pid or n.pid in _tree_pids(pids[n.node_id]))
        }
        missing = sorted(set(self.nodes) - live)
        if missing:
            seen = {n.node_id: f"pid {n.pid} ttl {n.lease_ttl_s}" for n in status.nodes}
            detail = ", ".join(f"{m} ({seen.get(m, 'absent')}; running pid {pids.get(m)})" for m in missing)
            return False, f"not registered: {detail}"
        roles = {r.role for r in status.leaders}
        if not {"placement", "migration"} <= roles:
            return False, f"leaders: {sorted(roles)}"
        for name in self.schedulers:
            try:
                async with AsyncClient(self.nodes[name].address, timeout_s=2, retries=0) as c:
                    services = {s.name: s for s in await c.list_services()}
            except Exception as e:
                return False, f"{name}: {type(e).__name__}"
            if SERVICE not in services or set(services[SERVICE].engines) != set(self.engine_ids):
                got = services[SERVICE].engines if SERVICE in services else None
                return False, f"{name} routes {SERVICE} to {got}"
            try:
                async with httpx.AsyncClient(timeout=2) as h:
                    r = await h.get(f"http://{self.nodes[name].http}/health")
                if r.status_code != 200:
                    return False, f"{name} http /health {r.status_code}"
            except Exception as e:
                return False, f"{name} http: {type(e).__name__}"
        return True, ""

    def restart_exited(self) -> list[str]:
        """What ``llmfleet up``'s supervisor does: start again every child that exited (none of ours
        is meant to); returns ``"name (pid P, exit): log tail"`` for each, and keeps them in
        ``self.unexpected_exits``."""
        from llmfleet.supervisor import describe_returncode

        out = []
        for child in self.group.poll_exited():
            if child.name not in self.nodes or self.group[child.name] is not child:
                continue  # an old incarnation we killed ourselves
            note = f"{child.name} (pid {child.pid}, {describe_returncode(child.returncode)})"
            log.warning("%s exited unexpectedly; restarting it. Log tail:\n%s", note, child.log_tail(10))
            self.unexpected_exits.append(note)
            out.append(note)
            self.group.respawn(child.name)
        return out

    async def wait_whole(self, timeout_s: float, interval_s: float = 0.2) -> tuple[float | None, str]:
        """Seconds until whole (None on timeout) and the last thing missing; a child that exited
        meanwhile is restarted (and reported, see :meth:`restart_exited`)."""
        t0 = time.monotonic()
        why = ""
        while time.monotonic() - t0 < timeout_s:
            self.restart_exited()
            ok, why = await self.whole()
            if ok:
                return time.monotonic() - t0, ""
            await asyncio.sleep(interval_s)
        return None, why

    async def wait_routed(self, timeout_s: float = 240) -> None:
        took, why = await self.wait_whole(timeout_s)
        if took is None:
            raise TimeoutError(f"the cluster did not become whole in {timeout_s}s: {why}")

    async def respawn(self, name: str) -> None:
        self.group.respawn(name)

    def signal(self, name: str, sig: int) -> None:
        self.group[name].signal(sig)


# -- the load ----------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """One request as its client saw it."""

    path: str  # "sdk" | "http"
    phase: int
    prompt: int
    max_tokens: int
    started: float
    ended: float = 0.0
    ttft_s: float | None = None
    server_ttft_s: float | None = None  # SDK: the scheduler's own TTFT (usage.ttft_s)
    server_queue_s: float | None = None  # SDK: usage.queue_s
    status: str = "running"  # ok | error | lost | duplicated | gapped | wrong
    retries: int = 0
    error: str = ""
    tokens: int = 0


@dataclass
class Reference:
    token_ids: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    text: dict[tuple[int, int], str] = field(default_factory=dict)


async def compute_reference(address: str, lengths: Sequence[int], timeout_s: float = 120) -> Reference:
    """The uninterrupted greedy output of every (prompt, length), one request at a time."""
    from llmfleet.client import AsyncClient

    ref = Reference()
    async with AsyncClient(address, timeout_s=timeout_s) as c:
        for i, prompt in enumerate(PROMPTS):
            for n in lengths:
                done = await c.complete(prompt, service=SERVICE, max_tokens=n, temperature=0.0)
                ref.token_ids[i, n] = tuple(done.token_ids)
                ref.text[i, n] = done.text
    return ref


def _reason(text: str) -> str:
    """A retry / error message without its request id, pid or address details (for tallies)."""
    text = re.sub(r"[0-9a-f]{16,}", "<id>", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "<addr>", text)
    text = re.sub(r"\d+(\.\d+)?s\b", "<t>", text)
    return text[:160]


class _RetryTally(logging.Handler):
    """Counts the SDK's retry warnings (``llmfleet.client.aio``) by reason, per load phase."""

    def __init__(self, load: Load) -> None:
        super().__init__(logging.WARNING)
        self.load = load

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            msg = record.getMessage()
            if "retry" in msg:
                # "request <id>: scheduler at A unavailable (DETAIL); retry n/N on B in Xs"
                detail = msg.split("(", 1)[-1].rsplit(");", 1)[0] if "(" in msg else msg
                self.load.retry_reasons[self.load.phase]["sdk: " + _reason(detail)] += 1


class Load:
    """Closed-loop streaming workers through the SDK and the HTTP API, recording an :class:`Outcome`
    per request, attributed to ``self.phase`` at its start."""

    def __init__(
        self,
        sdk_addresses: list[str],
        http_addresses: list[str],
        reference: Reference | None,
        *,
        concurrency: int,
        lengths: Sequence[int] = LENGTHS,
        http_share: float = 0.5,
        request_timeout_s: float = 120,
        sdk_retries: int | None = None,
        http_retries: int = 5,
        clients: int | None = None,
        max_requests: int | None = None,
        seed: int = 0,
    ) -> None:
        self.sdk_addresses = sdk_addresses
        self.http_addresses = http_addresses
        self.reference = reference
        self.concurrency = concurrency
        self.lengths = tuple(lengths)
        self.n_http = round(concurrency * http_share)
        self.request_timeout_s = request_timeout_s
        self.sdk_retries = sdk_retries
        self.http_retries = http_retries
        self.clients = clients or concurrency
        self.max_requests = max_requests
        self.rng = random.Random(seed)
        self.phase = 0
        self.outcomes: list[Outcome] = []
        self.token_times: list[float] = []  # when any token reached any client (for stalls)
        self._last_token = 0.0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._sdk: list[Any] = []
        self._http: list[Any] = []
        self._issued = 0
        self.all_done = asyncio.Event()
        self.retry_reasons: dict[int, Counter[str]] = {}
        self._tally = _RetryTally(self)

    def set_phase(self, phase: int) -> None:
        self.phase = phase
        self.retry_reasons.setdefault(phase, Counter())

    def _note_token(self) -> None:
        now = time.monotonic()
        if now - self._last_token >= 0.05:  # a coarse trace is enough to find stalls
            self.token_times.append(now)
            self._last_token = now

    def _take(self) -> bool:
        if self.max_requests is not None and self._issued >= self.max_requests:
            return False
        self._issued += 1
        return True

    async def start(self) -> None:
        import httpx
        from llmfleet.client import AsyncClient

        n_sdk = self.concurrency - self.n_http
        self.set_phase(self.phase)
        sdk_log = logging.getLogger("llmfleet.client.aio")
        sdk_log.addHandler(self._tally)
        sdk_log.setLevel(logging.WARNING)
        sdk_log.propagate = False  # tallied, not printed
        kw: dict[str, Any] = {"timeout_s": self.request_timeout_s}
        if self.sdk_retries is not None:
            kw["retries"] = self.sdk_retries
        n_clients = max(1, min(self.clients, max(n_sdk, 1)))
        for i in range(n_clients):  # half the clients prefer each replica
            order = (
                self.sdk_addresses[i % len(self.sdk_addresses) :]
                + self.sdk_addresses[: i % len(self.sdk_addresses)]
            )
            self._sdk.append(AsyncClient(order, **kw))
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        n_http_clients = max(1, min(self.clients, max(self.n_http, 1)))
        self._http = [
            httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout_s, connect=5), limits=limits)
            for _ in range(n_http_clients)
        ]
        for w in range(n_sdk):
            self._tasks.append(asyncio.create_task(self._worker("sdk", w)))
        for w in range(self.n_http):
            self._tasks.append(asyncio.create_task(self._worker("http", w)))

    async def stop(self, drain_s: float) -> None:
        """Stop issuing; wait up to ``drain_s`` for open requests (those left are lost)."""
        self._stop.set()
        _, pending = await asyncio.wait(self._tasks, timeout=drain_s) if self._tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for o in self.outcomes:
            if o.status == "running":
                o.status, o.error = "lost", o.error or "no outcome by the end of the drain"
        logging.getLogger("llmfleet.client.aio").removeHandler(self._tally)
        for c in self._sdk:
            await c.close()
        for h in self._http:
            await h.aclose()

    async def _worker(self, path: str, w: int) -> None:
        rng = random.Random(self.rng.random())
        while not self._stop.is_set() and self._take():
            p = rng.randrange(len(PROMPTS))
            n = rng.choice(self.lengths)
            o = Outcome(path, self.phase, p, n, time.monotonic())
            self.outcomes.append(o)
            try:
                if path == "sdk":
                    await self._sdk_request(self._sdk[w % len(self._sdk)], o)
                else:
                    await self._http_request(self._http[w % len(self._http)], w, o)
            except asyncio.CancelledError:
                o.status, o.error = "lost", o.error or "cancelled at the end of the drain"
                raise
            except Exception as e:
                o.status, o.error = "error", f"{type(e).__name__}: {e}"[:300]
            o.ended = time.monotonic()
        if all(t.done() or t is asyncio.current_task() for t in self._tasks):
            self.all_done.set()

    def _judge(self, o: Outcome, tokens: Sequence[int] | None, text: str | None) -> None:
        if self.reference is None:
            o.status = (
                "ok" if o.tokens == o.max_tokens else ("duplicated" if o.tokens > o.max_tokens else "gapped")
            )
            return
        key = (o.prompt, o.max_tokens)
        if tokens is not None:
            want = self.reference.token_ids[key]
            if list(tokens) == list(want):
                o.status = "ok"
            elif len(tokens) > len(want):
                o.status = "duplicated"
            elif len(tokens) < len(want):
                o.status = "gapped"
            else:
                o.status = "wrong"
        else:
            want_text = self.reference.text[key]
            if text == want_text and o.tokens == o.max_tokens:
                o.status = "ok"
            elif o.tokens > o.max_tokens or (text is not None and len(text) > len(want_text)):
                o.status = "duplicated"
            elif o.tokens < o.max_tokens or (text is not None and len(text) < len(want_text)):
                o.status = "gapped"
            else:
                o.status = "wrong"
        if o.status != "ok":
            o.error = f"{o.status}: got {o.tokens} tokens, want {o.max_tokens}"

    async def _sdk_request(self, client: Any, o: Outcome) -> None:
        stream = client.generate(PROMPTS[o.prompt], service=SERVICE, max_tokens=o.max_tokens, temperature=0.0)
        tokens: list[int] = []
        index_error = ""
        async with stream:
            async for chunk in stream:
                if chunk.token_ids:
                    if o.ttft_s is None:
                        o.ttft_s = time.monotonic() - o.started
                    self._note_token()
                if chunk.index != len(tokens) and not index_error:
                    index_error = "duplicated" if chunk.index < len(tokens) else "gapped"
                tokens.extend(chunk.token_ids)
        o.retries = max(0, stream.attempts - 1)
        o.tokens = len(tokens)
        if stream.usage is not None:
            o.server_ttft_s, o.server_queue_s = stream.usage.ttft_s, stream.usage.queue_s
        if not stream.finished:
            o.status, o.error = "lost", "the stream ended without its final chunk"
            return
        self._judge(o, tokens, None)
        if index_error and o.status == "ok":
            o.status, o.error = index_error, f"chunk indices {index_error}"

    async def _http_request(self, h: Any, w: int, o: Outcome) -> None:
        body = {
            "model": SERVICE,
            "prompt": PROMPTS[o.prompt],
            "max_tokens": o.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        attempt = 0
        while True:
            base = self.http_addresses[(w + attempt) % len(self.http_addresses)]
            texts: list[str] = []
            usage: dict[str, Any] | None = None
            finished = False
            problem = ""
            retry_after = 0.0
            try:
                async with h.stream("POST", f"http://{base}/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        text = (await r.aread()).decode(errors="replace")[:200]
                        problem = f"HTTP {r.status_code}: {text}"
                        if r.status_code not in (429, 502, 503, 504):
                            raise RuntimeError(problem)  # final: a 4xx is not a fault to retry
                        with contextlib.suppress(ValueError, TypeError):
                            retry_after = float(r.headers.get("retry-after", 0))
                    else:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: "):
                                continue
                            data = line[6:]
                            if data == "[DONE]":
                                break
                            event = json.loads(data)
                            if "error" in event:
                                problem = f"error event: {event['error'].get('message', '')[:200]}"
                                continue
                            for ch in event.get("choices") or ():
                                if ch.get("text"):
                                    if o.ttft_s is None:
                                        o.ttft_s = time.monotonic() - o.started
                                    self._note_token()
                                    texts.append(ch["text"])
                                if ch.get("finish_reason"):
                                    finished = True
                            if event.get("usage"):
                                usage = event["usage"]
            except RuntimeError:
                raise
            except Exception as e:
                problem = f"{type(e).__name__}: {e}"[:200]
            if finished and not problem:
                o.retries = attempt
                o.tokens = int((usage or {}).get("completion_tokens", -1))
                self._judge(o, None, "".join(texts))
                return
            attempt += 1
            o.error = problem or "the stream ended without a finish reason"
            self.retry_reasons.setdefault(o.phase, Counter())["http: " + _reason(o.error)] += 1
            if attempt > self.http_retries:
                o.retries = attempt - 1
                raise RuntimeError(f"after {attempt} attempts: {o.error}")
            await asyncio.sleep(max(retry_after, min(2.0, 0.1 * 2 ** (attempt - 1))))


# -- faults ---------------------------------------------------------------------------------------------
@dataclass
class FaultResult:
    fault: str
    target: str
    injected_at_s: float  # since the load started
    healed_after_s: float  # inject -> heal (restart / SIGCONT)
    startup_s: float  # heal -> the restarted process answers gRPC health (its own start-up time)
    whole_after_inject_s: float | None
    whole_after_heal_s: float | None
    not_whole_reason: str = ""
    max_stall_s: float = 0.0  # longest time without a token reaching any client, inject -> whole + settle
    in_flight_at_inject: int = 0
    unexpected_exits: list[str] = field(default_factory=list)  # children that died on their own (restarted)
    counts: dict[str, Any] = field(default_factory=dict)


async def inject(cluster: ChaosCluster, fault: str, restart_delay_s: float) -> tuple[str, float, float]:
    """Inject ``fault``, wait, heal; returns (the target, seconds from inject to heal, seconds from the
    heal until a restarted process answers health (0 when nothing was restarted))."""
    t0 = time.monotonic()
    freeze_s = 1.5 * cluster.ttl
    if fault in ("engine", "scheduler", "profiler", "placement-leader", "migration-leader"):
        target = {"engine": cluster.engine_ids[0], "scheduler": "scheduler", "profiler": "profiler"}.get(
            fault
        )
        if target is None:
            role = fault.split("-")[0]
            target = await cluster.leader(role)
            if target not in cluster.nodes:
                raise RuntimeError(f"no {role} leader in etcd (got {target!r})")
        t0 = time.monotonic()
        cluster.restart_exited()
        cluster.group.kill(target, signal.SIGKILL)
        cluster.group.poll_exited()  # our kill: not an unexpected exit
        await asyncio.sleep(restart_delay_s)
        await cluster.respawn(target)
        t_heal = time.monotonic()
        with contextlib.suppress(Exception):  # a child that never gets healthy shows as "never whole"
            await cluster.group.wait_healthy_async(target, cluster.nodes[target].address, timeout=120)
        return target, t_heal - t0, time.monotonic() - t_heal
    elif fault == "etcd-kill":
        target = "etcd"
        cluster.etcd.kill()
        await asyncio.sleep(restart_delay_s)
        t_heal = time.monotonic()
        await cluster.etcd.astart()
        return target, t_heal - t0, time.monotonic() - t_heal
    elif fault == "etcd-freeze":
        target = "etcd"
        cluster.etcd.pause()
        await asyncio.sleep(freeze_s)
        cluster.etcd.resume()
    elif fault == "engine-freeze":
        target = cluster.engine_ids[-1]
        cluster.signal(target, signal.SIGSTOP)
        await asyncio.sleep(freeze_s)
        cluster.signal(target, signal.SIGCONT)
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(ALL_FAULTS)}")
    return target, time.monotonic() - t0, 0.0


def _counts(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    by = {
        s: sum(o.status == s for o in outcomes)
        for s in ("ok", "error", "lost", "duplicated", "gapped", "wrong", "running")
    }
    out: dict[str, Any] = {"started": len(outcomes), "completed": by["ok"]}
    out.update({k: v for k, v in by.items() if k not in ("ok", "running")})
    out["retries"] = sum(o.retries for o in outcomes)
    out["retried_requests"] = sum(o.retries > 0 for o in outcomes)
    errors = [o.error for o in outcomes if o.status != "ok"]
    out["examples"] = sorted(set(errors))[:5]
    for path in ("sdk", "http"):
        sub = [o for o in outcomes if o.path == path]
        out[path] = {
            "started": len(sub),
            "completed": sum(o.status == "ok" for o in sub),
            "lost": sum(o.status == "lost" for o in sub),
            "dup_gap_wrong": sum(o.status in ("duplicated", "gapped", "wrong") for o in sub),
            "errors": sum(o.status == "error" for o in sub),
            "retries": sum(o.retries for o in sub),
        }
    return out


def _max_stall(times: Sequence[float], start: float, end: float) -> float:
    pts = [start, *[t for t in times if start <= t <= end], end]
    return max((b - a for a, b in itertools.pairwise(pts)), default=0.0)


async def run_chaos(
    cluster: ChaosCluster,
    faults: Sequence[str],
    *,
    concurrency: int,
    baseline_s: float,
    settle_s: float,
    restart_delay_s: float,
    whole_timeout_s: float,
    drain_s: float,
    sdk_retries: int | None = None,
    http_retries: int = 5,
    lengths: Sequence[int] = LENGTHS,
    seed: int = 0,
) -> dict[str, Any]:
    """Reference, then load: a baseline phase, then each fault in turn; returns the report dict."""
    await cluster.wait_routed()
    t_ref = time.monotonic()
    reference = await compute_reference(cluster.sdk_addresses[0], lengths)
    log.info(
        "reference of %d (prompt, length) pairs in %.1fs", len(reference.token_ids), time.monotonic() - t_ref
    )
    load = Load(
        cluster.sdk_addresses,
        cluster.http_addresses,
        reference,
        concurrency=concurrency,
        lengths=lengths,
        sdk_retries=sdk_retries,
        http_retries=http_retries,
        seed=seed,
    )
    rss_start = cluster.rss_kib()
    t_load = time.monotonic()
    await load.start()
    results: list[FaultResult] = []
    phases: list[tuple[str, float, float]] = []
    await asyncio.sleep(baseline_s)
    phases.append(("baseline", t_load, time.monotonic()))
    for k, fault in enumerate(faults, start=1):
        load.set_phase(k)
        t0 = time.monotonic()
        in_flight = sum(o.status == "running" for o in load.outcomes)
        log.info("fault %d/%d: %s (%d requests in flight)", k, len(faults), fault, in_flight)
        exits_before = len(cluster.unexpected_exits)
        target, healed, startup = await inject(cluster, fault, restart_delay_s)
        t_heal = t0 + healed
        took, why = await cluster.wait_whole(whole_timeout_s)
        t_whole = time.monotonic()
        await asyncio.sleep(settle_s)
        phases.append((fault, t0, time.monotonic()))
        results.append(
            FaultResult(
                fault=fault,
                target=target,
                injected_at_s=round(t0 - t_load, 2),
                healed_after_s=round(healed, 2),
                startup_s=round(startup, 2),
                whole_after_inject_s=None if took is None else round(t_whole - t0, 2),
                whole_after_heal_s=None if took is None else round(t_whole - t_heal, 2),
                not_whole_reason=why,
                in_flight_at_inject=in_flight,
                unexpected_exits=cluster.unexpected_exits[exits_before:],
            )
        )
        log.info("  %s: healed after %.1fs, whole after %s", target, healed, results[-1].whole_after_inject_s)
    load.set_phase(len(faults) + 1)
    await load.stop(drain_s)
    rss_end = cluster.rss_kib()
    baseline = [o for o in load.outcomes if o.phase == 0]
    for k, r in enumerate(results, start=1):
        r.counts = _counts([o for o in load.outcomes if o.phase == k])
        _, start, end = phases[k]
        r.max_stall_s = round(_max_stall(load.token_times, start, end), 2)
        r.counts["retry_reasons"] = dict(load.retry_reasons.get(k, Counter()).most_common(6))
    tail = [o for o in load.outcomes if o.phase == len(faults) + 1]
    return {
        "config": {
            "concurrency": concurrency,
            "http_workers": load.n_http,
            "sdk_workers": concurrency - load.n_http,
            "lengths": list(lengths),
            "ttl_s": cluster.ttl,
            "engines": cluster.engine_ids,
            "processes": sorted(cluster.nodes),
            "baseline_s": baseline_s,
            "settle_s": settle_s,
            "restart_delay_s": restart_delay_s,
            "sdk_retries": sdk_retries if sdk_retries is not None else "SDK default",
            "http_retries": http_retries,
            "faults": list(faults),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "engine_freeze_note": "no network namespaces: 'cut off the network' is SIGSTOP of the engine",
        },
        "baseline": {
            **_counts(baseline),
            "max_stall_s": round(_max_stall(load.token_times, *phases[0][1:]), 2),
        },
        "faults": [asdict(r) for r in results],
        "after_faults": _counts(tail),
        "total": _counts(load.outcomes),
        "ttft_p50_s": _pct([o.ttft_s for o in load.outcomes if o.ttft_s is not None], 50),
        "rss_kib": {"start": rss_start, "end": rss_end},
        "duration_s": round(time.monotonic() - t_load, 1),
    }


def _pct(xs: Sequence[float], p: float) -> float | None:
    if not xs:
        return None
    if len(xs) == 1:
        return round(xs[0], 4)
    return round(statistics.quantiles(sorted(xs), n=100, method="inclusive")[int(p) - 1], 4)


def goals(report: dict[str, Any]) -> dict[str, bool]:
    """The issue's goals, checked against a report."""
    ttl = report["config"]["ttl_s"]
    tot = report["total"]
    return {
        "0 lost": tot["lost"] == 0,
        "0 duplicated/gapped/wrong": tot["duplicated"] + tot["gapped"] + tot["wrong"] == 0,
        "0 client errors": tot["error"] == 0,
        "whole within one TTL of the heal": all(
            f["whole_after_heal_s"] is not None and f["whole_after_heal_s"] <= ttl for f in report["faults"]
        ),
        "whole within one TTL of the restarted process's start-up": all(
            f["whole_after_heal_s"] is not None and f["whole_after_heal_s"] - f["startup_s"] <= ttl
            for f in report["faults"]
        ),
    }


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        "# Chaos run",
        "",
        f"{cfg['concurrency']} concurrent streams ({cfg['sdk_workers']} SDK with both replicas, "
        f"{cfg['http_workers']} HTTP `/v1/completions` alternating replicas), greedy, max_tokens in "
        f"{cfg['lengths']}, lease TTL {cfg['ttl_s']} s, engines {', '.join(cfg['engines'])}; "
        f"{cfg['cpus']} CPUs; {report['duration_s']} s of load. SDK retries: {cfg['sdk_retries']}; "
        f"HTTP retries: {cfg['http_retries']}. Requests count in the phase they started in.",
        "",
        "| fault | target | in flight | started | completed | lost | dup/gap/wrong | errors (sdk/http) "
        "| retries (sdk/http) | whole after inject | after heal | of which start-up | max stall |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    b = report["baseline"]
    lines.append(
        f"| (baseline) | - | - | {b['started']} | {b['completed']} | {b['lost']} | "
        f"{b['duplicated'] + b['gapped'] + b['wrong']} | {b['sdk']['errors']}/{b['http']['errors']} | "
        f"{b['sdk']['retries']}/{b['http']['retries']} | - | - | - | {b['max_stall_s']} s |"
    )
    for f in report["faults"]:
        c = f["counts"]
        whole = "never" if f["whole_after_inject_s"] is None else f"{f['whole_after_inject_s']} s"
        heal = "never" if f["whole_after_heal_s"] is None else f"{f['whole_after_heal_s']} s"
        lines.append(
            f"| {f['fault']} | {f['target']} | {f['in_flight_at_inject']} | {c['started']} | {c['completed']} "
            f"| {c['lost']} | {c['duplicated'] + c['gapped'] + c['wrong']} | "
            f"{c['sdk']['errors']}/{c['http']['errors']} | {c['sdk']['retries']}/{c['http']['retries']} "
            f"| {whole} | {heal} | {f['startup_s']} s | {f['max_stall_s']} s |"
        )
    t = report["total"]
    lines += [
        f"| **total** | | | {t['started']} | {t['completed']} | {t['lost']} | "
        f"{t['duplicated'] + t['gapped'] + t['wrong']} | {t['sdk']['errors']}/{t['http']['errors']} | "
        f"{t['sdk']['retries']}/{t['http']['retries']} | | | | |",
        "",
        "Goals: " + ", ".join(f"{k}: {'met' if v else '**missed**'}" for k, v in goals(report).items()),
        "",
        f"'{cfg['engine_freeze_note']}'. 'whole': every process registered with a live lease, both "
        "leaders elected, both schedulers route the service to every engine and answer HTTP /health. "
        "'max stall': the longest time no token reached any client between the inject and the end of "
        "the settle.",
        "",
    ]
    for f in report["faults"]:
        if f["counts"]["examples"] or f["not_whole_reason"]:
            lines.append(f"- {f['fault']}: {'; '.join(f['counts']['examples'])} {f['not_whole_reason']}")
        if f.get("unexpected_exits"):
            lines.append(
                f"- {f['fault']}: exited on their own (restarted): {', '.join(f['unexpected_exits'])}"
            )
    lines += ["", "Retry reasons (count) per fault:", ""]
    for f in report["faults"]:
        reasons = f["counts"].get("retry_reasons") or {}
        if reasons:
            lines.append(f"- {f['fault']}: " + "; ".join(f"{k} ({v})" for k, v in reasons.items()))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--faults",
        default=",".join(ALL_FAULTS),
        help=f"comma-separated, in order (default: all): {','.join(ALL_FAULTS)}",
    )
    p.add_argument(
        "--duration", type=float, default=None, help="seconds of settled load after each fault (default 10)"
    )
    p.add_argument("--baseline", type=float, default=10.0, help="seconds of load before the first fault")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent streams, half SDK, half HTTP")
    p.add_argument(
        "--ttl", type=int, default=None, help="lease TTL of every process (default: the product default)"
    )
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--restart-delay-s", type=float, default=1.0, help="kill -> restart (up's first backoff)")
    p.add_argument("--whole-timeout-s", type=float, default=120.0)
    p.add_argument("--drain-s", type=float, default=120.0)
    p.add_argument(
        "--sdk-retries", type=int, default=None, help="the SDK's retries (default: its own default)"
    )
    p.add_argument("--http-retries", type=int, default=5)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".bench/chaos")
    p.add_argument("--keep", action="store_true", help="keep the cluster's state dir")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("llmfleet").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from llmfleet.config import DEFAULT_TTL_S

    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for f in faults:
        if f not in ALL_FAULTS:
            p.error(f"unknown fault {f!r}; known: {', '.join(ALL_FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="llmfleet-chaos-"))
    cluster = ChaosCluster(root, engines=args.engines, ttl=args.ttl or DEFAULT_TTL_S)
    try:
        cluster.start()
        report = asyncio.run(
            run_chaos(
                cluster,
                faults,
                concurrency=args.concurrency,
                baseline_s=args.baseline,
                settle_s=args.duration if args.duration is not None else 10.0,
                restart_delay_s=args.restart_delay_s,
                whole_timeout_s=args.whole_timeout_s,
                drain_s=args.drain_s,
                sdk_retries=args.sdk_retries,
                http_retries=args.http_retries,
                lengths=[int(x) for x in args.lengths.split(",")],
                seed=args.seed,
            )
        )
    finally:
        cluster.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report["state_dir"] = str(root)
    (out / "chaos.json").write_text(json.dumps(report, indent=2))
    (out / "chaos.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'chaos.json'} and {out / 'chaos.md'}; logs under {root / 'logs'}")
    if not args.keep:
        import shutil

        shutil.rmtree(root / "etcd", ignore_errors=True)
    return 0 if all(goals(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
