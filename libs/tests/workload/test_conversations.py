"""Prompt content (system prompts, seeded segments) and multi-turn conversations: each turn resends
the history; turn counts and lengths follow the published means; conversations stay whole when dealt
to services; a closed population of users holds one conversation after another; ``llmfleet sim`` and
``llmfleet load`` build and replay them."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from llmfleet.cli.main import build_parser
from llmfleet.cli.workload_args import build_workload
from llmfleet.replay.requests import replay_requests
from llmfleet.sim.run import assign_services
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import Workload, WorkloadRequest
from llmfleet.workload.conversations import LMSYS_CHAT_1M, conversations, deal_sessions, users
from llmfleet.workload.prompts import (
    VOCAB,
    prompt_text,
    prompt_token_ids,
    segment_ids,
    with_system_prompts,
)


def plain(rid: str, prompt: int, service: str = "a", t: float = 0.0) -> WorkloadRequest:
    return WorkloadRequest(rid, t, prompt, 5, service)


# ------------------------------------------------------------------------------------ content


def test_segments_are_deterministic_prefix_streams():
    a = segment_ids(7, 500)
    assert a.min() >= 0 and a.max() < VOCAB and len(set(a.tolist())) > VOCAB // 2
    assert np.array_equal(segment_ids(7, 200), a[:200])  # a shorter one is a prefix
    assert not np.array_equal(segment_ids(8, 500), a)


def test_system_prompts_are_per_service_and_shared_within_one():
    w = with_system_prompts(
        Workload((plain("r1", 50), plain("r2", 80), plain("r3", 80, "b"), plain("r4", 20))), 30
    )
    r1, r2, r3, r4 = (next(r for r in w if r.request_id == i) for i in ("r1", "r2", "r3", "r4"))
    assert (r1.system_tokens, r4.system_tokens, r4.parts) == (30, 20, ())  # a short prompt: all system
    for r in (r1, r2, r3, r4):
        assert len(prompt_text(r).split()) == r.prompt_tokens == len(prompt_token_ids(r))
    words = {r.request_id: prompt_text(r).split() for r in w}
    assert words["r1"][:30] == words["r2"][:30] != words["r3"][:30]  # service a's, then service b's
    assert words["r4"] == words["r1"][:20]
    assert words["r1"][30:] != words["r2"][30:50]  # the rest is each request's own
    # the system prompt follows the service label (so relabelling by the simulator keeps it per service)
    assert prompt_text(WorkloadRequest("x", 0, 30, 1, "b", system_tokens=30)).split() == words["r3"][:30]
    assert with_system_prompts(w, 10) == w  # requests with content are kept
    assert prompt_text(plain("p", 10)) == ""  # no content, no text
    with pytest.raises(ValueError, match="no prompt content"):
        prompt_token_ids(plain("p", 10))
    with pytest.raises(ValueError, match="system_tokens must be an int >= 1"):
        with_system_prompts(w, 0)


def test_content_is_validated_and_round_trips_through_jsonl(tmp_path: Path):
    with pytest.raises(ValueError, match="system_tokens \\+ parts' tokens = 25, but prompt_tokens = 30"):
        WorkloadRequest("r", 0, 30, 1, system_tokens=5, parts=((1, 20),))
    with pytest.raises(ValueError, match="a part needs"):
        WorkloadRequest("r", 0, 30, 1, parts=((1, 20), (2, 0), (3, 10)))
    with pytest.raises(TypeError, match="session must be a str"):
        # a wrong type on purpose: the check under test
        WorkloadRequest("r", 0, 3, 1, session=5)  # type: ignore[arg-type]
    w = conversations(5, rate=1.0, mean_turns=3.0, system_tokens=40, seed=2)
    path = tmp_path / "w.jsonl"
    w.to_jsonl(path)
    assert Workload.from_jsonl(path) == w
    plain_path = tmp_path / "plain.jsonl"
    Workload((plain("r", 3),)).to_jsonl(plain_path)
    assert "parts" not in plain_path.read_text()  # plain workloads' files are as they were


# ------------------------------------------------------------------------------- conversations


def by_session(w: Workload) -> dict[str, list[WorkloadRequest]]:
    out: dict[str, list[WorkloadRequest]] = defaultdict(list)
    for r in w:
        out[r.session].append(r)
    return out


def test_each_turn_resends_the_history():
    w = conversations(40, rate=2.0, mean_turns=4.0, system_tokens=100, think_s=5.0, seed=1)
    convs = by_session(w)
    assert any(len(turns) >= 3 for turns in convs.values())
    for session, turns in convs.items():
        assert [r.request_id for r in turns] == [f"{session}-t{k + 1}" for k in range(len(turns))]
        assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(turns))
        for prev, nxt in itertools.pairwise(turns):
            # the next prompt is the previous prompt, its answer, and a new user message
            assert nxt.parts[: len(prev.parts)] == prev.parts
            assert nxt.parts[len(prev.parts)][1] == prev.output_tokens
            assert nxt.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert prompt_text(nxt).startswith(prompt_text(prev) + " ")
        assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in turns)
    assert len({prompt_text(t[0]).split()[100] for t in convs.values()}) > 1  # own messages after the system


def test_each_later_turn_follows_the_one_before_by_its_think_time():
    w = conversations(40, rate=2.0, mean_turns=4.0, think_s=5.0, seed=1)
    assert w.closed_loop
    for turns in by_session(w).values():
        assert turns[0].follows == "" and turns[0].think_s == 0.0
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.follows == prev.request_id and nxt.think_s > 0
            assert nxt.arrival_s == pytest.approx(prev.arrival_s + nxt.think_s)  # its earliest time


def test_a_turn_must_follow_an_earlier_request_and_subsets_cut_the_link():
    with pytest.raises(ValueError, match="follows must name another request"):
        WorkloadRequest("r", 0, 3, 1, follows="r")
    with pytest.raises(ValueError, match="think_s needs follows"):
        WorkloadRequest("r", 0, 3, 1, think_s=1.0)
    with pytest.raises(ValueError, match="think_s must be finite"):
        WorkloadRequest("r", 0, 3, 1, follows="q", think_s=-1.0)
    a, b = plain("a", 3, t=1.0), WorkloadRequest("b", 2.0, 3, 5, "z", follows="a", think_s=1.0)
    with pytest.raises(ValueError, match="b follows 'a', which is not an earlier request"):
        Workload((b,))
    with pytest.raises(ValueError, match="not an earlier request"):
        Workload((replace(a, arrival_s=3.0), b))
    w = Workload((a, b))
    assert w.window(1.5, 3.0).requests[0].follows == ""  # its predecessor was cut away
    assert w.by_service()["z"].requests[0] == replace(b, follows="", think_s=0.0)
    assert w.head(2) == w


def test_turns_and_lengths_follow_the_published_means():
    w = conversations(4000, rate=10.0, seed=5, max_context=100_000)
    turns = Counter(r.session for r in w)
    assert np.mean(list(turns.values())) == pytest.approx(LMSYS_CHAT_1M.mean_turns, rel=0.05)
    first = [r for r in w if r.request_id.endswith("-t1")]
    assert np.mean([r.prompt_tokens for r in first]) == pytest.approx(LMSYS_CHAT_1M.mean_user_tokens, rel=0.1)
    assert np.mean([r.output_tokens for r in w]) == pytest.approx(LMSYS_CHAT_1M.mean_answer_tokens, rel=0.1)
    starts = sorted(r.arrival_s for r in first)
    assert len(first) / starts[-1] == pytest.approx(10.0, rel=0.1)  # conversations start at the rate
    assert conversations(50, rate=1.0, seed=5) == conversations(50, rate=1.0, seed=5)
    assert conversations(50, rate=1.0, seed=5) != conversations(50, rate=1.0, seed=6)


def test_a_conversation_ends_before_the_context_is_full():
    w = conversations(200, rate=1.0, mean_turns=20.0, max_context=1500, seed=4)
    assert max(r.prompt_tokens + r.output_tokens for r in w) <= 1500
    assert np.mean(list(Counter(r.session for r in w).values())) < 20


@pytest.mark.parametrize(
    "options, message",
    [
        ({"n": 0}, "n must be an int >= 1"),
        ({"mean_turns": 0.5}, "mean_turns must be finite and >= 1"),
        ({"think_s": -1.0}, "think_s must be finite and >= 0"),
        ({"system_tokens": 100, "max_context": 50}, "max_context must be an int > system_tokens"),
        ({"services": ()}, "services must be non-empty names"),
    ],
)
def test_bad_options_are_refused(options, message):
    kwargs = {"n": 3, "rate": 1.0, **options}
    with pytest.raises(ValueError, match=message):
        conversations(**kwargs)


def test_conversations_are_dealt_to_services_whole():
    w = conversations(30, rate=2.0, mean_turns=3.0, system_tokens=20, services=("x",), seed=3)
    dealt = deal_sessions(w, [("a", "m1"), ("b", "m2")])
    for turns in by_session(dealt).values():
        assert len({(r.service, r.model) for r in turns}) == 1
    assert Counter(turns[0].service for turns in by_session(dealt).values()) == {"a": 15, "b": 15}
    # the simulator's labelling keeps conversations whole too (not k-means over lengths)
    spec = SimSpec(
        ClusterSpec.parse("2xA100-80GB"), (SimService("a", "llama2-7b"), SimService("b", "opt-6.7b"))
    )
    assert assign_services(w, spec) == deal_sessions(w, [("a", "llama2-7b"), ("b", "opt-6.7b")])
    a_turn = next(r for r in dealt if r.service == "a")
    b_turn = next(r for r in dealt if r.service == "b")
    assert prompt_text(a_turn).split()[:20] != prompt_text(b_turn).split()[:20]  # per-service system prompts


# ------------------------------------------------------------------------------------------ users


def by_user(w: Workload) -> dict[str, list[WorkloadRequest]]:
    out: dict[str, list[WorkloadRequest]] = defaultdict(list)
    for r in w:
        out[r.request_id.split("-")[0]].append(r)
    return out


def test_each_user_holds_one_conversation_after_another_until_the_span():
    w = users(40, span_s=120.0, mean_turns=3.0, system_tokens=50, think_s=5.0, seed=2)
    people = by_user(w)
    assert sorted(people) == sorted(f"user{u}" for u in range(40))
    for u, (name, turns) in enumerate(sorted(people.items(), key=lambda kv: int(kv[0][4:]))):
        assert (
            turns[0].arrival_s == pytest.approx(5.0 * u / 40) and turns[0].follows == ""
        )  # evenly over one think
        for prev, nxt in itertools.pairwise(turns):  # one chain: every turn waits for the one before
            assert nxt.follows == prev.request_id and nxt.think_s > 0
            assert nxt.arrival_s == pytest.approx(prev.arrival_s + nxt.think_s)
            if nxt.session != prev.session:  # a new conversation: after the last turn of the one before
                assert nxt.request_id.endswith("-t1") and prev.session.startswith(f"{name}-conv")
                assert int(nxt.session.rsplit("conv", 1)[1]) == int(prev.session.rsplit("conv", 1)[1]) + 1
        assert turns[-1].arrival_s <= 120.0
    assert max(len({r.session for r in t}) for t in people.values()) >= 3
    for turns in by_session(w).values():  # each conversation resends its own history only
        assert turns[0].parts[:1] == turns[0].parts and turns[0].prompt_tokens == 50 + turns[0].parts[0][1]
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.parts[: len(prev.parts)] == prev.parts


def test_users_mix_the_turns_in_the_workloads_proportions():
    """In the span's second half (every user past their first conversation), the share of first turns
    is about 1 / mean_turns, where an open stream past capacity holds mostly first turns."""
    w = users(400, span_s=400.0, mean_turns=3.7, think_s=10.0, seed=3, max_context=100_000)
    late = [r for r in w if r.arrival_s >= 200.0]
    share = sum(r.request_id.endswith("-t1") for r in late) / len(late)
    assert share == pytest.approx(1 / 3.7, rel=0.1)
    assert users(30, span_s=50.0, seed=1) == users(30, span_s=50.0, seed=1)
    assert users(30, span_s=50.0, seed=1) != users(30, span_s=50.0, seed=2)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"n": 0}, "n must be an int >= 1"),
        ({"span_s": 0.0}, "span_s must be finite and > 0"),
        ({"think_s": 0.0}, "users need think_s > 0"),
        ({"mean_turns": 0.5}, "mean_turns must be finite and >= 1"),
        ({"system_tokens": 100, "max_context": 102}, "leaves almost no conversation room"),
    ],
)
def test_bad_user_options_are_refused(options, message):
    kwargs = {"n": 3, "span_s": 30.0, **options}
    with pytest.raises(ValueError, match=message):
        users(**kwargs)


# ------------------------------------------------------------------------------------- CLI, replay


def args(cmd: str, argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args([cmd, *argv])


def test_sim_and_load_build_the_same_conversations_and_load_sends_their_text():
    argv = ["--conversations", "20", "--rate", "2", "--mean-turns", "3", "--think-s", "4", "--seed", "9"]
    argv += ["--system-prompt-tokens", "64"]
    w = build_workload(args("load", argv))
    assert w == build_workload(args("sim", argv))
    assert w == conversations(20, rate=2.0, mean_turns=3.0, think_s=4.0, system_tokens=64, seed=9)
    reqs = replay_requests(w, [SimService("chat", "llama2-7b")])
    assert {r.service for r in reqs} == {"chat"}
    sent = {r.request_id: r.prompt(seed=0) for r in reqs}
    for r in assign_services(
        w, SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("chat", "llama2-7b"),))
    ):
        assert sent[r.request_id] == prompt_text(r) and len(sent[r.request_id].split()) == r.prompt_tokens
    # --system-prompt-tokens on a plain workload: every prompt starts with its service's system prompt
    syn = build_workload(args("load", ["--synthetic", "5", "--seed", "1", "--system-prompt-tokens", "16"]))
    texts = [r.prompt(seed=0).split() for r in replay_requests(syn, [SimService("chat", "llama2-7b")])]
    assert all(t[:16] == texts[0][:16] for t in texts) and texts[0][16:40] != texts[1][16:40]


def test_sim_and_load_build_the_same_users():
    argv = ["--users", "12", "--span", "30", "--mean-turns", "3", "--think-s", "4", "--seed", "9"]
    argv += ["--system-prompt-tokens", "64", "--max-context", "2048"]
    w = build_workload(args("load", argv))
    assert w == build_workload(args("sim", argv))
    assert w == users(
        12, span_s=30.0, mean_turns=3.0, think_s=4.0, system_tokens=64, max_context=2048, seed=9
    )
    with pytest.raises(ValueError, match="--think-s: --users needs a think time > 0"):
        build_workload(args("sim", [*argv, "--think-s", "0"]))
    with pytest.raises(SystemExit):
        args("sim", ["--users", "5", "--conversations", "5"])


def test_workload_flags_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="--mean-turns needs --conversations or --users"):
        build_workload(args("sim", ["--synthetic", "5", "--mean-turns", "3"]))
    with pytest.raises(ValueError, match="--lengths-from"):
        build_workload(args("sim", ["--conversations", "5", "--lengths-from", "x.csv"]))
    with pytest.raises(SystemExit):
        args("sim", ["--conversations", "5", "--mean-turns", "0.5"])
