"""Process helpers shared by the supervisor (:mod:`llmfleet.supervisor`) and the local etcd
(:mod:`llmfleet.coord.local_etcd`): start a child that dies with its parent, check that a command can
be executed, describe an exit status, read a log's tail.

Children never outlive the parent: :func:`with_pdeathsig` wraps a command so that it gets
PR_SET_PDEATHSIG on Linux (set by a tiny exec shim, not a ``preexec_fn``: see there), so they are sent
the signal when the thread that spawned them dies (spawn from the main thread or another long-lived
one, never from a short-lived worker thread).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 40


def describe_returncode(rc: int | None) -> str:
    """``0`` -> ``"code 0"``, ``-9`` -> ``"signal SIGKILL"``, None -> ``"still running"``."""
    if rc is None:
        return "still running"
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-rc).name}"
        return f"signal {-rc}"
    return f"code {rc}"


def tail(path: Path | None, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of a text file ("<no log>" when it cannot be read)."""
    if path is None:
        return "<no log>"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(data.splitlines()[-n:]) or "<empty log>"


# Runs as the child itself (a fresh interpreter, so nothing is inherited from the parent's threads):
# set PR_SET_PDEATHSIG, check the parent is still the one that spawned us, then exec the real command
# (same pid, and the death signal survives execve).
_PDEATHSIG_SHIM = f"""
import ctypes, os, sys
sig, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, sig, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    os._exit(1)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("cannot start " + argv[0] + ": " + str(e) + "\\n")
    os._exit(127)
"""


def with_pdeathsig(argv: Sequence[str], sig: int = signal.SIGTERM) -> list[str]:
    """``argv`` started so that it gets ``sig`` when the spawning thread dies (PR_SET_PDEATHSIG), via
    a small exec shim: the child runs a fresh ``python -S`` that sets the signal and ``execvp``s
    ``argv`` (same pid). Off Linux, ``argv`` unchanged.

    Why not ``preexec_fn``: it runs Python in the forked child of a multi-threaded parent. With gRPC
    threads busy in the parent (the services' health checks, a load generator, ``llmfleet up``'s
    own calls), such children crashed before exec (SIGSEGV / SIGABRT, nothing in their log) for about
    one spawn in seven; a restart after a crash then failed silently. Without ``preexec_fn`` the
    fork+exec is done in C with nothing but async-signal-safe calls (vfork on Linux)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", "-c", _PDEATHSIG_SHIM, str(int(sig)), str(os.getpid()), *argv]


def check_executable(argv: Sequence[str], env: Mapping[str, str], cwd: str | Path | None) -> None:
    """Raise OSError as Popen would when ``argv[0]`` cannot be executed (the shim of
    :func:`with_pdeathsig` execs it later, in the child, where the error would only reach its log)."""
    exe = argv[0]
    if os.sep in exe:
        path = Path(cwd or ".") / exe if not os.path.isabs(exe) else Path(exe)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(2, "No such file or directory", exe)
    elif shutil.which(exe, path=env.get("PATH")) is None:
        raise FileNotFoundError(2, "No such file or directory", exe)
