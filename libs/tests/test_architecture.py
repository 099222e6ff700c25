"""The design's invariants, checked on the source: policies are pure, the import graph is acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = [ROOT / "libs", *sorted((ROOT / "services").glob("*"))]
PURE = ["llmfleet.policies", "llmfleet.predict", "llmfleet.load.book"]
FORBIDDEN_IN_PURE = {
    "grpc",
    "asyncio",
    "aetcd",
    "llmfleet.coord",
    "llmfleet.rpc",
    "llmfleet.api",
    "socket",
    "threading",
}
CLOCK_CALLS = {"time", "monotonic", "perf_counter", "now", "utcnow"}


def modules() -> dict[str, Path]:
    out = {}
    for root in PACKAGE_ROOTS:
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if not rel.parts[0].startswith("llmfleet") or "tests" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


def imports(path: Path, known: dict[str, Path] | None = None) -> set[str]:
    """Imported names; ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            submodules = {s for s in subs if known is not None and s in known}
            found.update(submodules or {node.module})
            found.update(subs)
    return found


def test_policies_and_predictors_are_pure():
    offenders = []
    for name, path in modules().items():
        if not any(name == p or name.startswith(p + ".") for p in PURE):
            continue
        for imp in imports(path):
            if any(imp == f or imp.startswith(f + ".") for f in FORBIDDEN_IN_PURE):
                offenders.append(f"{name} imports {imp}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base = node.func.value
                if (
                    node.func.attr in CLOCK_CALLS
                    and isinstance(base, ast.Name)
                    and base.id in {"time", "datetime"}
                ):
                    offenders.append(f"{name} reads the clock ({base.id}.{node.func.attr})")
    assert not offenders, offenders


def test_import_graph_is_acyclic():
    mods = modules()
    graph = {m: {i for i in imports(p, mods) if i in mods and i != m} for m, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            raise AssertionError(" -> ".join(cycle))


def test_the_check_sees_the_code():
    mods = modules()
    assert "llmfleet.policies.dispatch.round_robin" in mods and "llmfleet_scheduler.relay" in mods


OFFLINE = ["llmfleet.sim", "llmfleet.workload", "llmfleet.costmodel", "llmfleet.kvblocks"]


def test_simulator_and_its_inputs_do_no_service_io():
    """The simulator, workloads, cost models and KV accounting run without the services' I/O stack
    (no gRPC, etcd, asyncio): what they compute is a function of their inputs and the policy code."""
    offenders = []
    for name, path in modules().items():
        if not any(name == p or name.startswith(p + ".") for p in OFFLINE):
            continue
        for imp in imports(path):
            if any(imp == f or imp.startswith(f + ".") for f in FORBIDDEN_IN_PURE):
                offenders.append(f"{name} imports {imp}")
    assert not offenders, offenders
    assert any(m.startswith("llmfleet.sim.") for m in modules())


def test_control_plane_processes_do_not_import_scipy_optimize():
    """scipy.optimize costs about a second per process start (the CLI runs once per command, the
    integration tests start hundreds of processes): only code that fits a curve imports it, on use."""
    import subprocess
    import sys

    mods = [
        "llmfleet.cli.main",
        "llmfleet_scheduler.main",
        "llmfleet_placement.main",
        "llmfleet_migration.main",
    ]
    code = f"import sys\nfor m in {mods!r}: __import__(m)\nprint('scipy.optimize' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
