"""``llmfleet load --trace/--synthetic``: workload → requests, the report from recorded outcomes and etcd
samples (pure), the migration summary, and bad input (no cluster needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from llmfleet.cli.load_replay import write_live_report
from llmfleet.cli.main import build_parser, main
from llmfleet.cli.workload_args import build_workload
from llmfleet.replay.fleet import EngineState, FleetSample, gpu_log, placement_decisions, plan_sequence
from llmfleet.replay.migration import migration_summary
from llmfleet.replay.report import LiveOutcome, SoloTimes, live_report
from llmfleet.replay.requests import replay_requests, synthetic_prompt
from llmfleet.replay.targets import UnknownService, live_targets, model_names
from llmfleet.sim.run import assign_services
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import Slo
from llmfleet.workload import load_azure_trace
from llmfleet.workload.prompts import WORDS


def _trace(tmp_path: Path, rows: list[tuple[float, int, int]]) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{a},{b}\n" for t, a, b in rows))
    return p


def _args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["load", *argv])


ROWS = [(0.0, 12, 3), (0.5, 900, 200), (1.0, 7, 2), (1.5, 1000, 180), (2.0, 20, 4), (3.0, 850, 190)]


def test_requests_keep_arrivals_lengths_and_get_sims_services(tmp_path: Path) -> None:
    trace = _trace(tmp_path, ROWS)
    args = _args(["--trace", str(trace), "--rate-scale", "2"])
    workload = build_workload(args)
    services = [SimService("short", "llama2-7b"), SimService("long", "llama2-13b")]
    reqs = replay_requests(workload, services)
    assert [r.arrival_s for r in reqs] == [t / 2 for t, _, _ in ROWS]
    assert [(r.prompt_tokens, r.max_tokens) for r in reqs] == [(a, b) for _, a, b in ROWS]
    # the same labels llmfleet sim gives (k-means over lengths, the shorter cluster first)
    spec = SimSpec(ClusterSpec.parse("2xA100-80GB"), tuple(services))
    sim = assign_services(load_azure_trace(trace, rate_scale=2), spec)
    assert [r.service for r in reqs] == [r.service for r in sim.requests]
    assert {r.service for r in reqs if r.prompt_tokens < 100} == {"short"}
    for r in reqs:  # exactly N whitespace-separated words, deterministic per (seed, request)
        words = r.prompt(seed=3).split()
        assert len(words) == r.prompt_tokens and set(words) <= set(WORDS)
        assert r.prompt(seed=3) == r.prompt(seed=3) != r.prompt(seed=4)
    assert synthetic_prompt(0, 0, 0).split() != []  # an empty prompt is refused: one word


def test_synthetic_prompts_share_no_prefix_block() -> None:
    """The simulator sees a trace's lengths only, so no two of its prompts share cached blocks: live, no
    two synthetic prompts start with the same 16 words (one block), and every word is one the emulated
    engines' tokenizer knows (an unknown word is <unk>, the same id for every word)."""
    firsts = {tuple(synthetic_prompt(64, 0, i).split()[:16]) for i in range(500)}
    assert len(firsts) == 500
    assert all(set(w) <= set(WORDS) for w in firsts)


def test_synthetic_workload_is_the_sims(tmp_path: Path) -> None:
    a = build_workload(_args(["--synthetic", "50", "--rate", "5", "--seed", "2"]))
    b = build_workload(build_parser().parse_args(["sim", "--synthetic", "50", "--rate", "5", "--seed", "2"]))
    assert a == b and len(a) == 50


def _live() -> dict[str, ServiceSpec]:
    return {
        "chat": ServiceSpec("chat", "tiny-llama", Slo(ttft_s=2.0, tpot_s=0.2)),
        "summarize": ServiceSpec("summarize", "my-model", Slo(ttft_s=4.0, tpot_s=0.3)),
    }


def test_targets_follow_the_flags_and_name_unknown_services() -> None:
    names = model_names(_live(), {"my-model": "llama2-7b"})
    assert names == {"tiny-llama": "tiny-llama", "my-model": "llama2-7b"}
    got = live_targets(None, _live(), names)
    assert [(s.name, s.model, s.slo.ttft_s) for s in got] == [
        ("chat", "tiny-llama", 2.0),
        ("summarize", "llama2-7b", 4.0),
    ]
    assert [s.name for s in live_targets(["summarize", "chat"], _live(), names)] == ["summarize", "chat"]
    with pytest.raises(UnknownService, match=r"unknown service.*nope.*chat, summarize") as e:
        live_targets(["chat", "nope"], _live(), names)
    assert e.value.flag == "--services"


def _samples() -> list[FleetSample]:
    e0, e1 = EngineState("engine-0", 1, "a100-80gb", ("tiny-llama",)), EngineState("engine-1", 2, "a100-80gb")
    e1_on = EngineState("engine-1", 2, "a100-80gb", ("tiny-llama",))
    first = {"engine-0": ("tiny-llama",)}
    both = {"engine-0": ("tiny-llama",), "engine-1": ("tiny-llama",)}
    return [
        FleetSample(0.0, (e0, e1), first, plan_id=1, plan_policy="aladdin"),
        FleetSample(1.0, (e0, e1), first, plan_id=1, plan_policy="aladdin"),
        FleetSample(2.0, (e0, e1), both, plan_id=2, plan_policy="aladdin", plan_reason="rate up"),
        FleetSample(3.0, (e0, e1_on), both, plan_id=2, plan_policy="aladdin"),
        FleetSample(4.0, (e0, e1_on), both, plan_id=2, plan_policy="aladdin"),
    ]


def _outcomes() -> list[LiveOutcome]:
    out = []
    for i in range(6):
        t = 0.5 * i
        eng = "engine-0" if i < 4 else "engine-1"
        out.append(LiveOutcome(f"r{i}", "chat", t, t + 0.01, 100, 10, t + 0.2, t + 1.1, 10, eng, "length"))
    out.append(LiveOutcome("r6", "chat", 3.5, 3.5, 100, 10, error="UNAVAILABLE: no engine"))
    return out


def test_fleet_samples_give_gpus_over_time_and_the_plans_written() -> None:
    samples = _samples()
    assert gpu_log(samples) == [(0.0, 1), (3.0, 3)]
    (d,) = placement_decisions(samples)
    assert d["t"] == 2.0 and d["plan_id"] == 2 and d["status"] == "applied" and d["reason"] == "rate up"
    assert d["plan"] == "tp1[tiny-llama] + tp2[tiny-llama]" and d["moves"] == 1
    assert d["changes"] == ["engine-1: +tiny-llama"] and d["gpus_in_use"] == 3
    assert plan_sequence("tp1[tiny-llama]", [d, {**d, "t": 9.0}]) == ["tp1[tiny-llama]", d["plan"]]


def test_report_from_outcomes_has_the_sim_schema() -> None:
    services = [SimService("chat", "tiny-llama", Slo(ttft_s=0.5, tpot_s=0.05))]
    report = live_report(_outcomes(), _samples(), services, solo=SoloTimes(), wall_s=5.0).report
    o, c = report["overall"], report["cluster"]
    assert (o["requests"], o["completed"], o["failed"]) == (7, 6, 1)
    assert o["latency_s"]["mean"] == pytest.approx(1.09) and o["ttft_s"]["p50"] == pytest.approx(0.19)
    assert o["tpot_s"]["mean"] == pytest.approx(0.9 / 9)
    assert o["slo"]["aladdin"] == 0.0  # TPOT 0.1 s > 0.05 s
    assert (
        o["normalized_latency"]["n"] == 6 and o["slo"]["seallm"] is not None
    )  # tiny-llama is a catalog model
    assert c["gpus_in_use"] == [[0.0, 1], [3.0, 3]] and c["peak_gpus_in_use"] == 3
    assert c["mean_gpus_in_use"] == pytest.approx((1 * 2.99 + 3 * 0.6) / 3.59)  # first arrival → last finish
    assert c["peak_active_gpus"] == 2  # at t=3 only engine-1 (tp 2) has requests in flight
    assert c["gpu_seconds_busy"] is None and c["kv_utilization_mean"] is None and c["adapter_loads"] is None
    assert [d["plan_id"] for d in report["placement"]] == [2]
    assert report["plan"] == [{"instance_id": "engine-0", "models": ("tiny-llama",), "tp": 1}]
    assert report["live"]["errors"] == {"UNAVAILABLE: no engine": 1}
    assert report["live"]["engines"] == {"engine-0": 4, "engine-1": 2}  # who served the completed ones
    assert report["live"]["send_lag_s"]["max"] == pytest.approx(0.01)
    assert set(report) >= {"overall", "services", "cluster", "cost_models", "policy", "plan"}


def test_report_without_a_cost_model_leaves_seallm_out() -> None:
    services = [SimService("chat", "not-a-catalog-model", Slo(ttft_s=2, tpot_s=1))]
    report = live_report(_outcomes(), _samples(), services, solo=SoloTimes()).report
    assert report["overall"]["slo"]["seallm"] is None and report["overall"]["normalized_latency"]["n"] == 0
    assert report["overall"]["slo"]["aladdin"] == pytest.approx(6 / 7)


def test_migration_summary_merges_epochs_and_moves() -> None:
    epochs = {
        3: {"epoch": 3, "time": 102.0, "operations": 2, "planned": 2, "executed": 2, "activated": ["e1"]},
        4: {"epoch": 4, "time": 103.0, "operations": 1, "planned": 1, "executed": 1},
    }
    moves = {
        "m1": {"migration_id": "m1", "mode": "kv", "state": "done", "kv_bytes": 1024, "seconds": 0.5},
        "m2": {"migration_id": "m2", "mode": "tokens", "state": "done", "kv_bytes": 0, "seconds": 0.1},
        "m3": {"migration_id": "m3", "mode": "kv", "state": "failed", "kv_bytes": 9, "seconds": 0.1},
    }
    m = migration_summary("mell", 1.0, epochs, moves, t0_unix=100.0)
    assert (m["epochs"], m["executed"], m["kv_moves"], m["token_moves"], m["kv_bytes_moved"]) == (
        2,
        3,
        1,
        1,
        1024,
    )
    assert m["max_per_epoch"] == 2 and m["activations"] == [
        {"t": 2.0, "epoch": 3, "activated": ["e1"], "deactivated": [], "active_engines": None}
    ]


def test_report_files_are_written(tmp_path: Path) -> None:
    services = [SimService("chat", "tiny-llama", Slo(ttft_s=0.5, tpot_s=0.05))]
    report = live_report(_outcomes(), _samples(), services, solo=SoloTimes()).report
    paths = write_live_report(report, tmp_path / "out", "ctx")
    doc = json.loads(paths["json"].read_text())
    assert doc["title"] == "llmfleet load" and doc["runs"][0]["overall"]["completed"] == 6
    assert "| live |" in paths["markdown"].read_text() and paths["gpus"].stat().st_size > 0
    assert "requests" not in paths and not (tmp_path / "out" / "requests.jsonl").exists()


def test_the_requests_rows_are_the_records_the_report_counts_with_what_only_a_live_run_knows(
    tmp_path: Path,
) -> None:
    services = [SimService("chat", "tiny-llama", Slo(ttft_s=0.5, tpot_s=0.05))]
    run = live_report(_outcomes(), _samples(), services, solo=SoloTimes())
    paths = write_live_report(run.report, tmp_path / "out", "ctx", plots=False, records=run.rows)
    rows = [json.loads(line) for line in paths["requests"].read_text().splitlines()]
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(7)]
    r0 = rows[0]
    assert (r0["arrival_s"], r0["planned_s"], r0["first_token_s"], r0["instance"]) == (
        0.01,
        0.0,
        0.2,
        "engine-0",
    )
    assert r0["solo_s"] > 0 and r0["finish_reason"] == "length" and r0["engine_ttft_s"] is None
    assert rows[6]["failed"] == "UNAVAILABLE: no engine" and rows[6]["first_token_s"] is None
    done = [r for r in rows if not r["failed"]]
    assert len(done) == run.report["overall"]["completed"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "T", "--synthetic", "5"], "argument --synthetic: not allowed with argument --trace"),
        (["--trace", "T", "--rate-scale", "0"], "argument --rate-scale: must be > 0"),
        (["--trace", "T", "--rate-scale", "-1"], "argument --rate-scale: must be > 0"),
        (["--synthetic", "0"], "argument --synthetic: must be >= 1"),
        (["--trace", "T", "--phase", "chat:1:1"], "argument --phase: not allowed with argument --trace"),
        (
            ["--shared-prefix", "5", "--phase", "chat:1:1"],
            "argument --phase: not allowed with argument --shared-prefix",
        ),
        (
            ["--conversations", "5", "--service", "chat"],
            "argument --service/-s: not allowed with argument --conversations",
        ),
        (["--trace", "T", "--rate", "3"], "argument --rate: not allowed with argument --trace"),
        (["--trace", "missing.csv"], "argument --trace: no such file"),
        (["--trace", "T", "--services", "chat,,x"], "argument --services: expected a services YAML"),
        (["--trace", "T", "--services", "chat,chat"], "argument --services: a service is named twice"),
        (["--trace", "T", "--services", "nope.yaml"], "argument --services: no such services file"),
        (["--trace", "T", "--cluster", "4xTPU-v9"], "argument --cluster"),
        (["--trace", "T", "--via", "carrier-pigeon"], "argument --via"),
        (["--trace", "T", "--end", "0"], "argument --end: must be > 0"),
    ],
)
def test_bad_flags_are_argparse_errors_naming_the_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    trace = str(_trace(tmp_path, ROWS))
    argv = [trace if a == "T" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["load", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_trace_that_does_not_parse_fails_at_start_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,ten,5\n")
    # no etcd or scheduler is asked: the trace fails first
    rc = main(["load", "--trace", str(bad), "--etcd", "127.0.0.1:1", "--scheduler", "127.0.0.1:1"])
    assert rc == 2
    assert f"{bad}:3: ContextTokens must be an integer" in capsys.readouterr().out


def test_an_unreachable_etcd_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from llmfleet.ports import free_port

    trace = _trace(tmp_path, ROWS)
    rc = main(["load", "--trace", str(trace), "--etcd", f"127.0.0.1:{free_port()}", "--out", str(tmp_path)])
    assert rc == 2
    assert "argument --etcd: cannot read the cluster from etcd" in capsys.readouterr().out


def test_send_all_sends_on_time_and_records_every_request() -> None:
    import asyncio
    import io
    import time

    from llmfleet.cli.load_replay import send_all
    from llmfleet.replay.requests import ReplayRequest
    from rich.console import Console

    reqs = [ReplayRequest(f"r{i}", 0.05 * i, "chat", 3, 2, i) for i in range(5)]
    seen: list[tuple[str, float, str]] = []

    async def main_() -> list[LiveOutcome]:
        t0 = time.monotonic()

        async def send(r: ReplayRequest, prompt: str) -> LiveOutcome:
            now = time.monotonic() - t0
            seen.append((r.request_id, now, prompt))
            if r.request_id == "r3":
                raise RuntimeError("boom")
            await asyncio.sleep(0.01)
            return LiveOutcome(
                r.request_id, r.service, r.arrival_s, now, 3, 2, now + 0.005, now + 0.01, 2, "e0"
            )

        return await send_all(reqs, send, t0, seed=1, report_s=0.1, console=Console(file=io.StringIO()))

    out = asyncio.run(main_())
    assert [o.request_id for o in out] == [r.request_id for r in reqs]
    assert all(abs(t - r.arrival_s) < 0.05 for (_, t, _), r in zip(seen, reqs, strict=True))
    assert all(len(p.split()) == 3 for _, _, p in seen)
    assert [o.ok for o in out] == [True, True, True, False, True] and out[3].error == "RuntimeError: boom"


def test_send_all_sends_a_turn_its_think_time_after_the_turn_before_finished() -> None:
    """b follows a (slow: 0.2 s) by 0.1 s; d follows c, which fails, so d is never sent; e opens."""
    import asyncio
    import io
    import time

    from llmfleet.cli.load_replay import send_all
    from llmfleet.replay.requests import ReplayRequest
    from llmfleet.workload.followups import PREDECESSOR_FAILED
    from rich.console import Console

    reqs = [
        ReplayRequest("a", 0.0, "chat", 3, 2, 0),
        ReplayRequest("c", 0.0, "chat", 3, 2, 1),
        ReplayRequest("b", 0.1, "chat", 3, 2, 2, follows="a", think_s=0.1),
        ReplayRequest("d", 0.1, "chat", 3, 2, 3, follows="c", think_s=0.1),
        ReplayRequest("e", 0.15, "chat", 3, 2, 4),
    ]
    sent: dict[str, float] = {}
    ended: dict[str, float] = {}
    prompts: dict[str, str] = {}

    async def main_() -> list[LiveOutcome]:
        t0 = time.monotonic()

        async def send(r: ReplayRequest, prompt: str) -> LiveOutcome:
            now = sent[r.request_id] = time.monotonic() - t0
            prompts[r.request_id] = prompt
            if r.request_id == "c":
                return LiveOutcome("c", r.service, r.arrival_s, now, 3, 2, error="UNAVAILABLE: no engine")
            await asyncio.sleep(0.2 if r.request_id == "a" else 0.01)
            end = ended[r.request_id] = time.monotonic() - t0
            out = LiveOutcome(r.request_id, r.service, r.arrival_s, now, 3, 2, end - 0.005, end, 2, "e0")
            out.text = f" answer of {r.request_id}"
            return out

        return await send_all(reqs, send, t0, report_s=0.1, console=Console(file=io.StringIO()))

    out = {o.request_id: o for o in asyncio.run(main_())}
    assert list(out) == ["a", "c", "b", "d", "e"]  # workload order
    assert sent["b"] >= ended["a"] + 0.1 and sent["b"] < ended["a"] + 0.15
    assert out["b"].ok and out["b"].planned_s == pytest.approx(ended["a"] + 0.1, abs=0.01)
    assert "d" not in sent and out["d"].error == PREDECESSOR_FAILED
    assert sent["e"] < sent["b"]  # an opening request does not wait for anyone
    # b resends a's prompt and the answer a got, then its own message
    assert prompts["b"] == f"{prompts['a']} answer of a {reqs[2].prompt()}"
    assert all(o.text == "" for o in out.values())  # the report keeps no completion text


def test_a_users_next_conversation_waits_for_the_last_one_but_does_not_resend_it() -> None:
    """A user's next conversation follows the last turn of the one before (it is sent its think time
    after that turn finished) but opens a new session: its prompt is its own, not that history; the
    turn after it continues it and resends it."""
    import asyncio
    import io
    import time

    from llmfleet.cli.load_replay import send_all
    from llmfleet.replay.requests import replay_requests
    from llmfleet.sim.spec import SimService
    from llmfleet.workload.conversations import users
    from rich.console import Console

    w = users(1, span_s=60.0, mean_turns=2.0, think_s=0.02, system_tokens=8, max_context=400, seed=3)
    reqs = replay_requests(w, [SimService("chat", "llama2-7b")])[:6]
    opener = next(r for r in reqs if r.follows and r.session != reqs[0].session)
    sent: dict[str, float] = {}
    ended: dict[str, float] = {}
    prompts: dict[str, str] = {}

    async def main_() -> list[LiveOutcome]:
        t0 = time.monotonic()

        async def send(r, prompt: str) -> LiveOutcome:
            now = sent[r.request_id] = time.monotonic() - t0
            prompts[r.request_id] = prompt
            await asyncio.sleep(0.02)
            end = ended[r.request_id] = time.monotonic() - t0
            out = LiveOutcome(r.request_id, r.service, r.arrival_s, now, 3, 2, end - 0.005, end, 2, "e0")
            out.text = f" answer of {r.request_id}"
            return out

        return await send_all(reqs, send, t0, report_s=0.1, console=Console(file=io.StringIO()))

    out = asyncio.run(main_())
    assert all(o.ok for o in out)
    assert sent[opener.request_id] >= ended[opener.follows] + opener.think_s - 0.005
    assert prompts[opener.request_id] == opener.prompt()  # its own system prompt and first message
    assert f"answer of {opener.follows}" not in prompts[opener.request_id]
    after = next(r for r in reqs if r.follows == opener.request_id)  # user0-conv1-t2 continues it
    assert after.session == opener.session
    assert prompts[after.request_id].startswith(f"{prompts[opener.request_id]} answer of {opener.request_id}")


def test_report_splits_ttft_into_the_engines_own_and_the_path_outside_them() -> None:
    outcomes = _outcomes()
    for o, engine in zip(outcomes, (0.15, 0.12, None, 0.19, 0.1, 0.18), strict=False):
        o.engine_ttft_s = engine  # None: e.g. through the HTTP API, or a migrated request
    services = [SimService("chat", "tiny-llama", Slo(ttft_s=0.5, tpot_s=0.05))]
    live = live_report(outcomes, _samples(), services).report["live"]
    assert live["engine_ttft_s"]["n"] == 5  # the failed request and the unreported one are left out
    assert live["engine_ttft_s"]["p50"] == pytest.approx(0.15)
    # client TTFT (first token − sent) is 0.19 s for each: the path added 0.04, 0.07, 0.0, 0.09, 0.01
    assert live["path_ttft_s"]["mean"] == pytest.approx((0.04 + 0.07 + 0.0 + 0.09 + 0.01) / 5)
    assert live["path_parts_s"]["client_scheduler"]["n"] == 0  # no scheduler figures: no parts


def test_report_sums_the_prompt_tokens_the_engines_found_cached() -> None:
    outcomes = _outcomes()  # 6 served with 100 prompt tokens each, then a failed one
    for o, cached in zip(outcomes, (0, 64, None, 96, 0, 32, 48), strict=True):
        o.cached_tokens = cached  # None: the usage did not say
    overall = live_report(outcomes, _samples(), [SimService("chat", "tiny-llama", Slo(0.5, 0.05))]).report[
        "overall"
    ]
    # the failed request and the silent one are left out, as in the simulator's report (its schema)
    assert overall["prefix_cache"] == {
        "requests": 5,
        "prompt_tokens": 500,
        "cached_tokens": 192,
        "cached_share": pytest.approx(0.384),
    }


def test_report_splits_the_path_at_the_scheduler() -> None:
    outcomes = _outcomes()
    for o, engine in zip(outcomes, (0.15, 0.12, None, 0.19, 0.1, 0.18), strict=False):
        o.engine_ttft_s = engine
        o.scheduler_ttft_s, o.scheduler_queue_s = 0.17 if o.request_id != "r1" else None, 0.005
    live = live_report(outcomes, _samples(), [SimService("chat", "tiny-llama", Slo(0.5, 0.05))]).report[
        "live"
    ]
    parts = live["path_parts_s"]
    # the requests with every figure (r1 has no scheduler figure): the engines' TTFT 0.15, 0.19, 0.1, 0.18 s
    assert parts["client_scheduler"]["n"] == 4
    assert parts["client_scheduler"]["mean"] == pytest.approx(0.19 - 0.17)  # client TTFT 0.19 s
    assert parts["scheduler_dispatch"]["mean"] == pytest.approx(0.005)
    engine = [0.17 - 0.005 - e for e in (0.15, 0.19, 0.1, 0.18)]  # the parts add up to the path
    assert parts["scheduler_engine"]["mean"] == pytest.approx(sum(engine) / 4)
