"""The systemd units of ``deploy/systemd/``, checked two ways.

1. ``systemd-analyze verify`` on every unit instance, with the install paths filled in (the venv's
   bin directory for ``/opt/llmfleet/.venv/bin``, this user for ``User=``, temporary env files for
   ``/etc/llmfleet``): unknown or misspelled directives, bad values and missing executables fail.
   Skipped only where ``systemd-analyze`` is missing or cannot verify even a trivial unit.
2. systemd is not PID 1 here, so each unit's ``ExecStart=`` is run the way systemd would run it:
   a clean environment from ``Environment=`` and ``EnvironmentFile=`` (``-`` = optional, files
   override), ``%`` specifiers, ``$VAR`` split into words, ``${VAR}`` as one word, the
   ``StateDirectory=`` and ``WorkingDirectory=``. etcd comes from ``llmfleet-etcd.service``, then
   every control-plane service, the OpenAI front and one engine from their templates; each must answer
   gRPC health, register under its id, serve a request end to end (the front: over HTTP), and exit 0
   on ``KillSignal``.

The shipped ``*.env.example`` files are checked too: their variables are ones the code (or etcd)
reads, and each instance's command line, built from them, parses with the service's own flags.
"""

from __future__ import annotations

import getpass
import grp
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from harness import prepare_endless_llama
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup, free_port

REPO = Path(__file__).resolve().parents[1]
UNIT_DIR = REPO / "deploy" / "systemd"
BIN = Path(sys.executable).parent
INSTALL_BIN = "/opt/llmfleet/.venv/bin"
ETC = "/etc/llmfleet"
CONTROL = ("scheduler", "profiler", "placement", "migration", "front")
# (unit file, instance) for every unit instance the deployment uses
INSTANCES = [
    *[("llmfleet@.service", s) for s in CONTROL],
    ("llmfleet-engine@.service", "engine-0"),
    ("llmfleet-etcd.service", None),
]
# what systemd puts in a unit's environment before Environment= (User= adds HOME, USER, ...)
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def unit_name(unit: str, instance: str | None) -> str:
    return unit.replace("@.", f"@{instance}.") if instance else unit


# -- a small systemd unit interpreter ----------------------------------------------------------------
def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in file order (keys repeat: Environment=, EnvironmentFile=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path}: {line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not key=value: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(sections: dict[str, list[tuple[str, str]]], key: str, section: str = "Service") -> list[str]:
    return [v for k, v in sections.get(section, []) if k == key]


def specifiers(text: str, unit: str, instance: str | None, state: Path, cache: Path) -> str:
    """Resolve the ``%`` specifiers the units use; any other one fails (teach it here first)."""
    table = {
        "i": instance or "",
        "I": instance or "",
        "n": unit_name(unit, instance),
        "p": unit.split("@")[0].removesuffix(".service"),
        "S": str(state),
        "C": str(cache),
        "H": socket.gethostname(),
        "%": "%",
    }

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in table:
            raise AssertionError(f"{unit}: specifier %{m.group(1)} not handled by this test in {text!r}")
        return table[m.group(1)]

    return re.sub(r"%(.)", one, text)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def read_env_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile= syntax: KEY=VALUE lines, # and ; comments, optional quotes."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()), f"{path}: bad line {raw!r}"
        env[key.strip()] = _unquote(value.strip())
    return env


def unit_environment(
    sections: dict[str, list[tuple[str, str]]], unit: str, instance: str | None, state: Path, cache: Path
) -> dict[str, str]:
    """Environment= assignments, then EnvironmentFile= files (which override them), as systemd does."""
    env: dict[str, str] = {}
    for line in values(sections, "Environment"):
        for word in shlex.split(specifiers(line, unit, instance, state, cache)):
            key, sep, value = word.partition("=")
            assert sep, f"{unit}: Environment={line!r} is not KEY=VALUE"
            env[key] = value
    for line in values(sections, "EnvironmentFile"):
        path = specifiers(line, unit, instance, state, cache)
        optional = path.startswith("-")
        path = path.removeprefix("-")
        if not Path(path).exists():
            assert optional, f"{unit}: EnvironmentFile={path} is missing (systemd would refuse to start)"
            continue
        env.update(read_env_file(Path(path)))
    return env


def expand_exec(line: str, env: dict[str, str], unit: str) -> list[str]:
    """ExecStart= -> argv: a word that is exactly ``$VAR`` becomes VAR's words (none when unset or
    empty), ``${VAR}`` is replaced in place; quotes group words."""
    assert line[:1] not in "@-:+!", f"{unit}: ExecStart prefixes are not handled by this test: {line!r}"
    argv: list[str] = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv.extend(env.get(m.group(1), "").split())
            continue
        word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word)
        assert "$" not in word, f"{unit}: unsupported variable use in ExecStart word {word!r}"
        argv.append(word)
    return argv


class Installed:
    """The units as installed under ``root``: /opt/llmfleet/.venv/bin -> this venv, /etc/llmfleet ->
    root/etc, User=/Group= -> this user, %S -> root/state, %C -> root/cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.units = root / "units"
        self.etc = root / "etc"
        self.state = root / "state"
        self.cache = root / "cache"
        for d in (self.units, self.etc, self.state, self.cache):
            d.mkdir(parents=True, exist_ok=True)
        user, group = getpass.getuser(), grp.getgrgid(os.getgid()).gr_name
        for src in sorted(UNIT_DIR.glob("*.service")):
            text = src.read_text().replace(INSTALL_BIN, str(BIN)).replace(ETC, str(self.etc))
            text = re.sub(r"(?m)^User=.*$", f"User={user}", text)
            text = re.sub(r"(?m)^Group=.*$", f"Group={group}", text)
            (self.units / src.name).write_text(text)

    def install_examples(self) -> None:
        """Every ``X.env.example`` as etc/X.env."""
        for src in UNIT_DIR.glob("*.env.example"):
            shutil.copy(src, self.etc / src.name.removesuffix(".example"))

    def write_env(self, name: str, **env: str) -> None:
        (self.etc / f"{name}.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))

    def command(self, unit: str, instance: str | None) -> tuple[list[str], dict[str, str], Path | None]:
        """(argv, environment, working directory) of the unit's ExecStart, creating its state and
        cache directories as systemd does."""
        sections = parse_unit(self.units / unit)
        for key, base in (("StateDirectory", self.state), ("CacheDirectory", self.cache)):
            for line in values(sections, key):
                for d in line.split():
                    (base / specifiers(d, unit, instance, self.state, self.cache)).mkdir(
                        parents=True, exist_ok=True
                    )
        env = {**BASE_ENV, **unit_environment(sections, unit, instance, self.state, self.cache)}
        (exec_start,) = values(sections, "ExecStart")
        argv = expand_exec(specifiers(exec_start, unit, instance, self.state, self.cache), env, unit)
        wd = values(sections, "WorkingDirectory")
        cwd = Path(specifiers(wd[-1], unit, instance, self.state, self.cache)) if wd else None
        assert cwd is None or cwd.is_dir(), f"{unit}: WorkingDirectory {cwd} does not exist at start"
        return argv, env, cwd

    def kill_signal(self, unit: str) -> int:
        (name,) = values(parse_unit(self.units / unit), "KillSignal") or ["SIGTERM"]
        return getattr(signal, name if name.startswith("SIG") else f"SIG{name}")


# -- 1. systemd-analyze verify -------------------------------------------------------------------------
def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice", "SYSTEMD_LOG_COLOR": "0"},
    )


@pytest.fixture(scope="module")
def analyze(tmp_path_factory) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    probe = tmp_path_factory.mktemp("probe") / "llmfleet-probe.service"
    probe.write_text("[Service]\nType=oneshot\nExecStart=/bin/true\n")
    r = _analyze(str(probe))
    if r.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot verify a trivial unit here: {r.stdout}{r.stderr}")


@pytest.mark.parametrize(("unit", "instance"), INSTANCES, ids=[unit_name(u, i) for u, i in INSTANCES])
def test_systemd_analyze_verify(analyze, tmp_path, unit, instance):
    inst = Installed(tmp_path)
    inst.install_examples()
    path = inst.units / unit_name(unit, instance)
    if instance:  # verify loads the template through the instance's name
        path.symlink_to(inst.units / unit)
    r = _analyze(str(path))
    out = r.stdout + r.stderr
    # warnings (unknown keys, unparsable values) leave the exit status 0: fail on any line about our units
    ours = [ln for ln in out.splitlines() if str(inst.units) in ln or unit.split("@")[0] in ln]
    assert r.returncode == 0 and not ours, f"systemd-analyze verify {path.name} (rc {r.returncode}):\n{out}"


# -- 2. the example env files ---------------------------------------------------------------------------
def _code_reads(name: str) -> bool:
    sources = [*REPO.glob("libs/llmfleet/**/*.py"), *REPO.glob("services/*/llmfleet_*/**/*.py")]
    return any(f'"{name}"' in p.read_text() for p in sources)


def test_env_examples_name_real_variables():
    names = set()
    for src in UNIT_DIR.glob("*.env.example"):
        for m in re.finditer(r"(?m)^#?\s*([A-Z][A-Z0-9_]*)=", src.read_text()):
            names.add((src.name, m.group(1)))
    assert names
    etcd_help = subprocess.run(
        [str(LocalEtcd.etcd_path()), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    for src, name in sorted(names):
        if name.startswith("ETCD_"):
            flag = "--" + name.removeprefix("ETCD_").lower().replace("_", "-")
            assert re.search(rf"^\s*{flag}\b", etcd_help, re.M), f"{src}: etcd has no {flag} for {name}"
        elif name != "LLMFLEET_ARGS" and not name.startswith("OTEL_"):
            assert _code_reads(name), f"{src}: nothing in libs/ or services/ reads {name}"


@pytest.mark.parametrize(("unit", "instance"), INSTANCES[:-1], ids=[unit_name(*x) for x in INSTANCES[:-1]])
def test_env_examples_parse(tmp_path, unit, instance):
    from llmfleet_engine.main import build_parser as engine
    from llmfleet_front.main import build_parser as front
    from llmfleet_migration.main import build_parser as migration
    from llmfleet_placement.main import build_parser as placement
    from llmfleet_profiler.main import build_parser as profiler
    from llmfleet_scheduler.main import build_parser as scheduler

    parsers = {"scheduler": scheduler, "profiler": profiler, "placement": placement}
    parsers |= {"migration": migration, "engine": engine, "front": front}
    inst = Installed(tmp_path)
    inst.install_examples()
    assert (inst.etc / f"{instance}.env").exists(), f"no {instance}.env.example"
    argv, _, _ = inst.command(unit, instance)
    assert Path(argv[0]).is_file() and os.access(argv[0], os.X_OK), argv[0]
    role = Path(argv[0]).name.removeprefix("llmfleet-")
    try:
        args = parsers[role]().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"{unit_name(unit, instance)}: {argv} does not parse ({e})")
    if role == "engine":
        assert args.id == instance


# -- 3. run every unit like systemd ---------------------------------------------------------------------
def _status(etcd: str, prefix: str) -> dict:
    import json

    out = subprocess.run(
        [str(BIN / "llmfleet"), "status", "--etcd", etcd, "--prefix", prefix, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def _complete_over_http(base: str, timeout_s: float = 30) -> None:
    """One completion through the front (once it has read the services from etcd)."""
    import httpx

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            r = httpx.post(f"{base}/v1/completions", json={"model": "chat", "prompt": "Hi", "max_tokens": 3},
                           timeout=10)  # fmt: skip
            if r.status_code == 200:
                assert r.json()["usage"]["completion_tokens"] == 3
                return
            last = r.text
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.25)
    raise AssertionError(f"no completion through the front at {base}: {last}")


def test_units_start_and_serve(tmp_path):
    from llmfleet.client import Client

    inst = Installed(tmp_path)
    endless = prepare_endless_llama(tmp_path / "models")
    client_port, peer_port = free_port(), free_port()
    while peer_port == client_port:
        peer_port = free_port()
    prefix = f"/systemd-{uuid.uuid4().hex[:8]}"
    etcd = f"127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    inst.write_env(
        "etcd",
        ETCD_LISTEN_CLIENT_URLS=f"http://{etcd}",
        ETCD_ADVERTISE_CLIENT_URLS=f"http://{etcd}",
        ETCD_LISTEN_PEER_URLS=peer,
        ETCD_INITIAL_ADVERTISE_PEER_URLS=peer,
        ETCD_INITIAL_CLUSTER=f"default={peer}",
    )
    inst.write_env(
        "llmfleet",
        LLMFLEET_ETCD=etcd,
        LLMFLEET_PREFIX=prefix,
        LLMFLEET_LEASE_TTL="2",
        LLMFLEET_HOST="127.0.0.1",
    )
    config = tmp_path / "cluster.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "services": {"chat": {"model": "tiny-llama", "max_tokens": 8}},
                "models": {"tiny-llama": {"source": str(endless)}},
                "engines": {"engine-0": {"models": ["tiny-llama"]}},
            }
        )
    )
    ports = {name: free_port() for name in (*CONTROL, "engine-0")}
    http_port = free_port()
    common = "--metrics-port 0"
    extra = {
        "scheduler": "--http-port -1",
        "front": f"--http-port {http_port} --workers 2",
        "placement": f"--config {config} --resync-s 1",
        "engine-0": f"--threads 1 --offline --model tiny-llama={endless}",
    }
    for name, port in ports.items():
        inst.write_env(name, LLMFLEET_ARGS=f"--port {port} {common} {extra.get(name, '')}".strip())

    procs = ProcessGroup(tmp_path / "logs")
    started: dict[str, str] = {}  # name -> unit

    def start(unit: str, instance: str | None) -> str:
        argv, env, cwd = inst.command(unit, instance)
        name = instance or "etcd"
        # env -i: the unit sees only its own environment, not this test's (no venv on PATH, ...)
        clean_env = [shutil.which("env") or "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items())]
        procs.spawn(name, [*clean_env, *argv], cwd=cwd)
        started[name] = unit
        return name

    try:
        start("llmfleet-etcd.service", None)
        probe = LocalEtcd(tmp_path / "unused", client_port=client_port, peer_port=peer_port)
        deadline = time.monotonic() + 30
        while not probe.healthy():
            assert procs["etcd"].alive, f"etcd unit exited:\n{procs['etcd'].log_tail()}"
            assert time.monotonic() < deadline, f"etcd unit not healthy:\n{procs['etcd'].log_tail()}"
            time.sleep(0.1)
        assert any((inst.state / "llmfleet-etcd").iterdir()), "etcd wrote nothing in its StateDirectory"

        for name in CONTROL:
            start("llmfleet@.service", name)
        start("llmfleet-engine@.service", "engine-0")
        for name, port in ports.items():
            procs.wait_healthy(name, f"127.0.0.1:{port}", timeout=60)

        # registered in etcd under the unit's prefix, at LLMFLEET_HOST, the engine as %i with its model
        def registered(s: dict) -> bool:
            roles = {n["role"] for n in s["nodes"]}
            engine = [n for n in s["nodes"] if n["node_id"] == "engine-0"]
            return roles >= {"scheduler", "profiler", "placement", "migration", "front", "engine"} and bool(
                engine and "tiny-llama" in engine[0]["models"]
            )

        deadline = time.monotonic() + 30
        while not registered(status := _status(etcd, prefix)):
            assert time.monotonic() < deadline, f"not all registered: {status['nodes']}"
            time.sleep(0.25)
        (engine,) = [n for n in status["nodes"] if n["node_id"] == "engine-0"]
        assert engine["address"] == f"127.0.0.1:{ports['engine-0']}"

        with Client(f"127.0.0.1:{ports['scheduler']}") as c:
            done = c.complete("Hello", service="chat", max_tokens=4)
        assert len(done.token_ids) == 4
        _complete_over_http(f"http://127.0.0.1:{http_port}")

        # the unit's KillSignal stops each cleanly, so Restart=on-failure does not restart it: systemd
        # takes exit 0 and death by SIGHUP, SIGINT, SIGTERM or SIGPIPE as clean (etcd re-raises SIGTERM)
        clean = {0, -signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM, -signal.SIGPIPE}
        for name in [*reversed(list(ports)), "etcd"]:
            procs[name].signal(inst.kill_signal(started[name]))
            rc = procs[name].wait(20)
            assert rc in clean, f"{name} exited {rc} on its KillSignal:\n{procs[name].log_tail()}"
    except BaseException:
        for child in procs.children:
            print(f"--- {child.name} ({child!r})\n{child.log_tail()}")
        raise
    finally:
        procs.stop_all(grace=5)
