"""Linux network namespaces as "hosts" for multi-host integration tests.

    hosts = Hosts.create(["host-a", "host-b"])       # or skip: netns_unavailable() says why
    try:
        argv = hosts.wrap("host-a", ["llmfleet-engine", "--host", hosts.address("host-a"), ...])
        ...
        hosts.partition("host-b")   # its veth (bridge side) down: every packet to and from it is lost
        hosts.heal("host-b")
    finally:
        hosts.close()               # idempotent; also run at exit and by the garbage collector

Layout: one bridge in the root namespace holding ``10.213.X.1/24`` (X picked at random among the
/24s no local address or route uses), and per host a namespace ``lfit-<pidns>-<pid>-<tag>-<host>``
(``<pidns>``: the creator's PID namespace inode, ``<tag>``: random per run) joined to
the bridge by a veth pair, with ``10.213.X.(10+i)/24``, loopback up and a default route via the
bridge. Processes in the root namespace reach every host at its address (the bridge is local), hosts
reach each other through the bridge (layer 2: no forwarding or firewall rules involved), and every
host reaches the root namespace's services at the bridge address.

Link names are at most 15 characters (``lf<tag>br``, ``lf<tag>r<i>`` / ``lf<tag>n<i>``) and each link
created here carries the alias ``llmfleet-it <pidns>-<pid>``: namespaces and links left by a run
that died without cleaning up (SIGKILL) are removed by the next ``Hosts.create`` once their pid is
gone from our PID namespace (:func:`clean_stale`; another PID namespace's leftovers are never touched).

Partition = the host's bridge port (root side of its veth) down: the kernel drops every frame to and
from it, no reset and no ICMP reaches the other side, so peers see a silent network; the host keeps
its address, routes and sockets. Heal = the port up again (STP off, forward delay 0: forwarding at once).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

NS_PREFIX = "lfit-"  # namespace names: lfit-<pidns>-<pid>-<tag>-<host>
ALIAS_PREFIX = "llmfleet-it "  # link aliases: "llmfleet-it <pidns>-<pid>"
SUBNET_BASE = "10.213"


class NetnsError(RuntimeError):
    pass


def _ip() -> str:
    path = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip") if os.path.exists(p)), None
    )
    if path is None:
        raise NetnsError("iproute2's `ip` is not installed")
    return path


def ip(*args: str, check: bool = True, timeout: float = 10) -> str:
    """Run ``ip *args``; returns stdout, raises NetnsError with stderr on failure (when ``check``)."""
    r = subprocess.run([_ip(), *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


@functools.cache
def netns_unavailable() -> str | None:
    """None when this process may create network namespaces, else why not (probed once per process:
    creates and deletes a namespace)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    try:
        _ip()
    except NetnsError as e:
        return str(e)
    name = f"{NS_PREFIX}{owner_tag()}-probe{uuid.uuid4().hex[:4]}"
    try:
        r = subprocess.run([_ip(), "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` could not run: {e}"
    if r.returncode != 0:
        return (
            f"`ip netns add` failed ({r.stderr.strip() or r.returncode}): needs root"
            f" (CAP_SYS_ADMIN and CAP_NET_ADMIN; euid {os.geteuid()})"
        )
    try:
        ip("-n", name, "link", "set", "lo", "up")
    except NetnsError as e:
        return f"namespace created but links cannot be configured: {e}"
    finally:
        ip("netns", "delete", name, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    # `ip netns list` prints "name" or "name (id: N)"
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _links() -> list[dict]:
    return json.loads(ip("-j", "link", "show") or "[]")


def netns_pids(ns: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", ns, check=False).split()]


def _delete_netns(ns: str) -> None:
    """Kill what still runs in ``ns`` (only ever one of ours: the name is unique to a run) and delete it."""
    for pid in netns_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    ip("netns", "delete", ns, check=False)


@functools.cache
def _pidns() -> str:
    """This process's PID namespace (inode): a pid means something only within it."""
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


def owner_tag() -> str:
    return f"{_pidns()}-{os.getpid()}"


def _stale(ns_or_alias: str) -> bool:
    """Made here by a process that no longer exists (in our PID namespace: others' pids we cannot see)."""
    for prefix in (NS_PREFIX, ALIAS_PREFIX):
        if ns_or_alias.startswith(prefix):
            pidns, _, rest = ns_or_alias[len(prefix) :].partition("-")
            pid = rest.split("-", 1)[0]
            return pidns == _pidns() and pid.isdigit() and not _alive(int(pid))
    return False


def clean_stale() -> list[str]:
    """Delete namespaces and links made here by processes that no longer exist; returns their names."""
    removed = []
    for ns in _netns_names():
        if _stale(ns):
            _delete_netns(ns)
            removed.append(ns)
    for link in _links():
        if _stale(link.get("ifalias", "")):
            ip("link", "del", link["ifname"], check=False)
            removed.append(link["ifname"])
    return removed


def _pick_subnet() -> ipaddress.IPv4Network:
    """A 10.213.X.0/24 that no local address or route overlaps."""
    used: list[ipaddress.IPv4Network] = []
    for a in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for info in a.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for r in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    choices = list(range(1, 255))
    random.shuffle(choices)
    for x in choices:
        net = ipaddress.ip_network(f"{SUBNET_BASE}.{x}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetnsError(f"no free /24 in {SUBNET_BASE}.0.0/16")


@dataclass(frozen=True)
class Host:
    name: str  # "host-a"
    netns: str  # lfit-<pid>-<tag>-host-a
    address: str  # 10.213.X.10
    veth_root: str  # the bridge port in the root namespace (partition: down)
    veth_ns: str  # its peer inside the namespace


class Hosts:
    """Namespaced hosts on one bridge; see the module docstring."""

    def __init__(self, tag: str, subnet: ipaddress.IPv4Network) -> None:
        self.tag = tag
        self.subnet = subnet
        self.bridge = f"lf{tag}br"
        self.gateway = str(subnet.network_address + 1)  # the bridge's address: the root namespace
        self.hosts: dict[str, Host] = {}
        self._finalizer = weakref.finalize(self, _teardown, self.bridge, self.hosts)  # also at exit

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def create(cls, names: Sequence[str]) -> Hosts:
        """Clean stale runs, then build the bridge and one namespace per name (torn down on failure)."""
        if len(names) > 200:
            raise ValueError("at most 200 hosts")
        reason = netns_unavailable()
        if reason is not None:
            raise NetnsError(reason)
        clean_stale()
        self = cls(uuid.uuid4().hex[:6], _pick_subnet())
        try:
            alias = f"{ALIAS_PREFIX}{owner_tag()}"
            ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            ip("link", "set", self.bridge, "alias", alias)
            ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                host = Host(
                    name=name,
                    netns=f"{NS_PREFIX}{owner_tag()}-{self.tag}-{name}",
                    address=str(self.subnet.network_address + 10 + i),
                    veth_root=f"lf{self.tag}r{i}",
                    veth_ns=f"lf{self.tag}n{i}",
                )
                self.hosts[name] = host
                ip("netns", "add", host.netns)
                ip("link", "add", host.veth_root, "type", "veth", "peer", "name", host.veth_ns,
                   "netns", host.netns)  # fmt: skip
                ip("link", "set", host.veth_root, "alias", alias)
                ip("link", "set", host.veth_root, "master", self.bridge)
                ip("link", "set", host.veth_root, "up")
                ns = ("-n", host.netns)
                ip(*ns, "link", "set", "lo", "up")
                ip(*ns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", host.veth_ns)
                ip(*ns, "link", "set", host.veth_ns, "up")
                ip(*ns, "route", "add", "default", "via", self.gateway)
        except BaseException:
            self.close()
            raise
        return self

    def netns_names(self) -> list[str]:
        return [h.netns for h in self.hosts.values()]

    def close(self) -> None:
        """Kill anything left in the namespaces, delete them (their veths go with them) and the bridge."""
        self._finalizer()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def leftovers(self) -> list[str]:
        """What of this run still exists: namespaces, links, processes in them (empty after close())."""
        mine = [ns for ns in _netns_names() if ns.startswith(f"{NS_PREFIX}{owner_tag()}-{self.tag}-")]
        out = [f"netns {ns}" for ns in mine] + [f"pid {p} in {ns}" for ns in mine for p in netns_pids(ns)]
        out += [f"link {lk['ifname']}" for lk in _links() if lk["ifname"].startswith(f"lf{self.tag}")]
        return out

    # -- use -----------------------------------------------------------------------------------------
    def address(self, name: str) -> str:
        return self.hosts[name].address

    def wrap(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``name``'s namespace (``ip netns exec`` execs it: same pid)."""
        return [_ip(), "netns", "exec", self.hosts[name].netns, *argv]

    def partition(self, name: str) -> None:
        """Cut host ``name`` off: its bridge port goes down, so its packets are dropped silently (no
        reset, no unreachable: to either side it looks like a dead network); its own address, routes
        and sockets stay."""
        ip("link", "set", self.hosts[name].veth_root, "down")

    def heal(self, name: str) -> None:
        ip("link", "set", self.hosts[name].veth_root, "up")

    def is_up(self, name: str) -> bool:
        link = json.loads(ip("-j", "link", "show", self.hosts[name].veth_root))[0]
        return "UP" in link.get("flags", []) and link.get("operstate") != "DOWN"

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h.name}={h.address}" for h in self.hosts.values())
        return f"Hosts({self.subnet}, bridge {self.bridge} {self.gateway}: {hosts})"


def _teardown(bridge: str, hosts: dict[str, Host]) -> None:  # holds no reference to the Hosts object
    for h in hosts.values():
        _delete_netns(h.netns)
    ip("link", "del", bridge, check=False)
    # the kernel dismantles a deleted namespace (and the veths in it) asynchronously: wait for it
    links = {h.veth_root for h in hosts.values()} | {bridge}
    deadline = time.monotonic() + 10
    while links & {lk["ifname"] for lk in _links()} and time.monotonic() < deadline:
        time.sleep(0.05)
