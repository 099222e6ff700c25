"""``llmfleet compare A.json B.json``: two reports in ``llmfleet sim``'s schema side by side.

  llmfleet sim --trace trace.csv --cluster-config cluster.yaml --policy seallm --out .sim
  llmfleet load --trace trace.csv --cluster-config cluster.yaml --out .load
  llmfleet compare .sim/report.json .load/report.json --out .compare

Each figure (latency mean/p50/p99, normalized latency, TTFT, the engines' own TTFT (a live report's,
from each engine's receipt of the request), TPOT (ATGT), the prompt tokens found in the engines' prefix
caches (each request's first prefill), SLO attainment, failed requests, throughput,
GPUs in use: mean, peak, GPU-seconds) with the difference and the relative
difference (B − A) / A; whether the two ran the same sequence of distinct placement plans; and a PNG
of GPUs in use over time for both. When both reports have their requests beside them
(``requests.jsonl``: ``llmfleet sim --records``, ``llmfleet load --records``), the requests are also
compared one by one (:mod:`llmfleet.replay.pairs`: the spread of each request's TTFT, engines' TTFT
and latency difference, and whether both found the same prompt tokens cached). Writes ``compare.md``,
``compare.json`` and ``gpus_in_use.png`` to ``--out``. A report with several runs (``llmfleet sim --compare``) is read at ``--run NAME``
(default: its first run). Exit 0, or 2 on a report that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.policies.placement import InstancePlan
from llmfleet.replay.fleet import plan_sequence
from llmfleet.replay.pairs import Pairing, pair, read_rows
from llmfleet.replay.pairs import markdown as pairs_markdown
from llmfleet.sim.replan import plan_summary

Getter = Callable[[Mapping[str, Any]], float | None]


def _get(*path: str) -> Getter:
    def get(run: Mapping[str, Any]) -> float | None:
        v: Any = run
        for k in path:
            if not isinstance(v, Mapping) or v.get(k) is None:
                return None
            v = v[k]
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return get


def _peak_gpus(run: Mapping[str, Any]) -> float | None:
    log = (run.get("cluster") or {}).get("gpus_in_use")
    return float(max(n for _, n in log)) if log else None


def _count(key: str) -> Getter:
    return lambda run: float(len(run[key])) if isinstance(run.get(key), list) else 0.0


def engine_ttft(stat: str) -> Getter:
    """The engines' own TTFT: a live report's ``live.engine_ttft_s`` (None when no engine reported it),
    else the report's TTFT (the simulator hands each request to its engine at its arrival)."""
    overall = _get("overall", "ttft_s", stat)

    def get(run: Mapping[str, Any]) -> float | None:
        live = run.get("live")
        if not isinstance(live, Mapping):
            return overall(run)
        d = live.get("engine_ttft_s") or {}
        return float(d[stat]) if d.get("n") else None

    return get


FIGURES: tuple[tuple[str, Getter], ...] = (
    ("requests", _get("overall", "requests")),
    ("completed", _get("overall", "completed")),
    ("failed", _get("overall", "failed")),
    ("latency mean s", _get("overall", "latency_s", "mean")),
    ("latency p50 s", _get("overall", "latency_s", "p50")),
    ("latency p99 s", _get("overall", "latency_s", "p99")),
    ("norm. latency mean", _get("overall", "normalized_latency", "mean")),
    ("norm. latency p99", _get("overall", "normalized_latency", "p99")),
    ("TTFT mean s", _get("overall", "ttft_s", "mean")),
    ("TTFT p50 s", _get("overall", "ttft_s", "p50")),
    ("TTFT p99 s", _get("overall", "ttft_s", "p99")),
    ("engines' TTFT mean s", engine_ttft("mean")),
    ("engines' TTFT p50 s", engine_ttft("p50")),
    ("TPOT (ATGT) mean s", _get("overall", "tpot_s", "mean")),
    ("TPOT (ATGT) p99 s", _get("overall", "tpot_s", "p99")),
    ("prompt tokens cached", _get("overall", "prefix_cache", "cached_tokens")),
    ("prompt share cached", _get("overall", "prefix_cache", "cached_share")),
    ("SLO TTFT+ATGT (Aladdin)", _get("overall", "slo", "aladdin")),
    ("SLO latency (SeaLLM)", _get("overall", "slo", "seallm")),
    ("SLO deadline (UELLM)", _get("overall", "slo", "uellm")),
    ("throughput req/s", _get("cluster", "throughput_rps")),
    ("throughput tok/s", _get("cluster", "throughput_tokens_per_s")),
    ("makespan s", _get("cluster", "makespan_s")),
    ("GPUs in use mean", _get("cluster", "mean_gpus_in_use")),
    ("GPUs in use peak", _peak_gpus),
    ("GPU·s in use", _get("cluster", "gpu_seconds")),
    ("active GPUs mean", _get("cluster", "mean_active_gpus")),
    ("placement decisions", _count("placement")),
    ("migrations executed", _get("migration", "executed")),
)


@dataclass
class Row:
    figure: str
    a: float | None
    b: float | None
    diff: float | None  # b - a
    rel: float | None  # (b - a) / |a|; None when a is 0 or either is missing


@dataclass
class Comparison:
    a_name: str
    b_name: str
    rows: list[Row]
    plans_a: list[str]
    plans_b: list[str]
    per_request: Pairing | None = None  # when both reports have their requests.jsonl

    @property
    def same_plans(self) -> bool:
        return self.plans_a == self.plans_b


class BadReport(ValueError):
    pass


def report_path(path: Path) -> Path:
    """The report file of ``path`` (a file, or a directory holding ``report.json``)."""
    return path / "report.json" if path.is_dir() else path


def load_run(path: Path, run: str | None = None) -> tuple[str, dict]:
    """(label, run) of a report file (or a directory holding ``report.json``)."""
    p = report_path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise BadReport(f"{p}: no such file") from None
    except (OSError, ValueError) as e:
        raise BadReport(f"{p}: not a JSON report: {e}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise BadReport(f"{p}: expected {{'runs': [...]}} as llmfleet sim / llmfleet load write it")
    names = [str((r.get("policy") or {}).get("name", f"run{i}")) for i, r in enumerate(runs)]
    if run is None:
        return f"{names[0]} ({p.parent.name or p.name})", runs[0]
    if run not in names:
        raise BadReport(f"{p}: no run {run!r}; runs: {', '.join(names)}")
    return f"{run} ({p.parent.name or p.name})", runs[names.index(run)]


def plans_of(run: Mapping[str, Any]) -> list[str]:
    """The distinct placement plans of a run in order: its starting ``plan``, then each applied decision."""

    start = [
        InstancePlan(p["instance_id"], tuple(p["models"]), int(p.get("tp", 1)))
        for p in run.get("plan") or ()
        if p.get("models")
    ]
    return plan_sequence(plan_summary(start) if start else "", run.get("placement") or ())


def per_request(a_path: Path, a: Mapping[str, Any], b_path: Path, b: Mapping[str, Any]) -> Pairing | None:
    """The two runs' requests paired, when both reports have ``requests.jsonl`` beside them (each read
    at its run's rows); None otherwise. BadReport naming a file that cannot be read."""
    files = [report_path(p).parent / "requests.jsonl" for p in (a_path, b_path)]
    if not all(f.exists() for f in files):
        return None
    try:
        rows = [
            read_rows(f, str((r.get("policy") or {}).get("name", "")))
            for f, r in zip(files, (a, b), strict=True)
        ]
    except (OSError, ValueError) as e:
        raise BadReport(str(e)) from None
    return pair(*rows)


def compare(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
    pairs: Pairing | None = None,
) -> Comparison:
    """The figures of ``a`` and ``b`` side by side, their plans, and ``pairs`` (their requests paired)."""
    rows = []
    for label, get in FIGURES:
        x, y = get(a), get(b)
        if x is None and y is None:
            continue
        diff = y - x if x is not None and y is not None else None
        rel = diff / abs(x) if diff is not None and x else None
        rows.append(Row(label, x, y, diff, rel))
    return Comparison(a_name, b_name, rows, plans_of(a), plans_of(b), pairs)


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if float(v).is_integer() and abs(v) < 1e9:
        return str(int(v))
    return f"{v:.3g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _rel(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1%}"


def markdown(c: Comparison) -> str:
    lines = [
        f"# {c.a_name} vs {c.b_name}",
        "",
        f"| figure | {c.a_name} | {c.b_name} | Δ | rel. Δ |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.figure} | {_fmt(r.a)} | {_fmt(r.b)} | {_fmt(r.diff)} | {_rel(r.rel)} |" for r in c.rows]
    lines += ["", f"**Same placement plans: {'yes' if c.same_plans else 'no'}**", ""]
    for name, plans in ((c.a_name, c.plans_a), (c.b_name, c.plans_b)):
        lines.append(f"- {name}: " + (" → ".join(f"`{p}`" for p in plans) or "(no plan)"))
    if c.per_request is not None:
        lines += ["", pairs_markdown(c.per_request, c.a_name, c.b_name)]
    return "\n".join(lines) + "\n"


def render(c: Comparison, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{escape(c.a_name)} vs {escape(c.b_name)}", title_justify="left")
    for col in ("figure", c.a_name, c.b_name, "Δ", "rel. Δ"):
        t.add_column(escape(col), justify="left" if col == "figure" else "right")
    for r in c.rows:
        t.add_row(r.figure, _fmt(r.a), _fmt(r.b), _fmt(r.diff), _rel(r.rel))
    console.print(t)
    same = "[green]yes[/]" if c.same_plans else "[yellow]no[/]"
    console.print(f"same placement plans: {same}")
    for name, plans in ((c.a_name, c.plans_a), (c.b_name, c.plans_b)):
        console.print(f"  {escape(name)}: " + escape(" → ".join(plans) or "(no plan)"), highlight=False)
    p = c.per_request
    if p is not None:
        d = p.diffs["engine_ttft_s"]
        median = f"{1e3 * d['p50']:+.1f} ms" if d.get("n") else "–"
        console.print(
            f"per request: {p.paired} paired; engines' TTFT B − A p50 {median}; same prompt tokens cached "
            + ("–" if p.same_cached_share is None else f"{p.same_cached_share:.1%}"),
            highlight=False,
        )


def plot_gpus(series: Mapping[str, tuple[Sequence[Sequence[float]], float]], path: Path) -> Path:
    """A step plot of GPUs in use over time, one line per ``label: (change points [[t, n]...], end)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, (log, end) in series.items():
        if not log:
            continue
        ts = [float(t) for t, _ in log]
        ns = [n for _, n in log]
        ax.step([*ts, max(float(end), ts[-1])], [*ns, ns[-1]], where="post", label=label)
    from matplotlib.ticker import MaxNLocator

    ax.set_ylim(bottom=0, top=max([n for log, _ in series.values() for _, n in log] or [1]) + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("time from the start (s)")
    ax.set_ylabel("GPUs in use")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(c: Comparison, a: Mapping[str, Any], b: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """``compare.md``, ``compare.json`` and ``gpus_in_use.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "compare.md", "json": out / "compare.json", "png": out / "gpus_in_use.png"}
    paths["markdown"].write_text(markdown(c))
    doc = {**asdict(c), "same_plans": c.same_plans}
    paths["json"].write_text(json.dumps(doc, indent=1))

    def series(run: Mapping[str, Any]) -> tuple[list, float]:
        cl = run.get("cluster") or {}
        return list(cl.get("gpus_in_use") or []), float(cl.get("makespan_s") or 0.0)

    plot_gpus({c.a_name: series(a), c.b_name: series(b)}, paths["png"])
    return paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=Path, metavar="A.json", help="first report (e.g. llmfleet sim's report.json)")
    p.add_argument("b", type=Path, metavar="B.json", help="second report (e.g. llmfleet load's report.json)")
    p.add_argument("--run", help="the run of A to compare when it has several (a policy name)")
    p.add_argument("--run-b", help="the run of B to compare when it has several")
    p.add_argument("--out", type=Path, default=Path(".compare"), help="output directory (default .compare)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    try:
        a_name, a = load_run(args.a, args.run)
        b_name, b = load_run(args.b, args.run_b)
        pairs = per_request(args.a, a, args.b, b)
    except BadReport as e:
        from rich.markup import escape

        Console(stderr=True, soft_wrap=True).print(
            f"[red]llmfleet compare:[/] {escape(str(e))}", highlight=False
        )
        return 2
    if a_name == b_name:
        a_name, b_name = f"A: {a_name}", f"B: {b_name}"
    c = compare(a, b, a_name, b_name, pairs)
    render(c, console)
    paths = write(c, a, b, args.out)
    console.print(f"written: {paths['markdown']}  {paths['json']}  {paths['png']}", highlight=False)
    return 0
