"""The shared-prefix workload (inference-perf's generator, llm-d's benchmark): groups share exactly their
system prompt, prompts recur in one shuffled order, ``llmfleet sim`` and ``llmfleet load`` build the
same requests and ``load`` sends their text."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pytest
from llmfleet.cli.main import build_parser
from llmfleet.cli.workload_args import build_workload
from llmfleet.replay.requests import replay_requests
from llmfleet.sim.spec import SimService
from llmfleet.workload.prompts import prompt_token_ids
from llmfleet.workload.shared_prefix import shared_prefix


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def test_groups_share_exactly_their_system_prompt_and_outputs_are_fixed():
    w = shared_prefix(60, rate=5.0, groups=3, prompts_per_group=4, system_tokens=40, question_tokens=12,
                      output_tokens=7, seed=1)  # fmt: skip
    reqs = list(w.requests)
    assert all(r.prompt_tokens == 52 and r.output_tokens == 7 for r in reqs)
    ids = {r.request_id: prompt_token_ids(r) for r in reqs}
    group = {r.request_id: r.parts[0][0] for r in reqs}
    for a in reqs[:12]:
        for b in reqs[:12]:
            shared = _common_prefix(ids[a.request_id], ids[b.request_id])
            if a.parts == b.parts:
                assert shared == 52  # the same prompt again: a full repeat
            elif group[a.request_id] == group[b.request_id]:
                assert 40 <= shared < 52  # the group's system prompt, then another question
            else:
                assert shared < 40
    assert len({r.parts for r in reqs}) == 12  # every one of the 3 x 4 prompts is used


def test_prompts_recur_in_one_shuffled_order_at_the_poisson_rate():
    w = shared_prefix(2000, rate=20.0, groups=5, prompts_per_group=2, seed=3)
    parts = [r.parts for r in w.requests]
    assert parts[:10] == parts[10:20] == parts[1990:2000]  # a cycle of the 10 prompts, as inference-perf
    assert len(set(parts[:10])) == 10
    assert Counter(r.parts[0] for r in w.requests).most_common(1)[0][1] == 400
    span = w.requests[-1].arrival_s
    assert 2000 / span == pytest.approx(20.0, rel=0.1)
    assert shared_prefix(2000, rate=20.0, groups=5, prompts_per_group=2, seed=3) == w
    assert shared_prefix(2000, rate=20.0, groups=5, prompts_per_group=2, seed=4) != w


@pytest.mark.parametrize(
    "options, message",
    [({"groups": 0}, "groups"), ({"question_tokens": -1}, "question_tokens"), ({"services": ()}, "services")],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        shared_prefix(10, rate=1.0, **options)


def _args(cmd: str, argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args([cmd, *argv])


def test_sim_and_load_build_the_same_requests_and_load_sends_their_text():
    argv = ["--shared-prefix", "30", "--rate", "3", "--prefix-groups", "2", "--prompts-per-group", "3"]
    argv += ["--prefix-tokens", "32", "--question-tokens", "8", "--output-tokens", "5", "--seed", "2"]
    w = build_workload(_args("load", argv))
    assert w == build_workload(_args("sim", argv))
    assert w == shared_prefix(30, rate=3.0, groups=2, prompts_per_group=3, system_tokens=32, question_tokens=8,
                              output_tokens=5, seed=2)  # fmt: skip
    texts = {
        r.request_id: r.prompt(seed=0).split() for r in replay_requests(w, [SimService("chat", "llama2-7b")])
    }
    assert all(len(t) == 40 for t in texts.values())
    by_group: dict[int, list[list[str]]] = {}
    for r in w.requests:
        by_group.setdefault(r.parts[0][0], []).append(texts[r.request_id])
    assert len(by_group) == 2
    for same in by_group.values():
        assert all(t[:32] == same[0][:32] for t in same)
    first, second = by_group.values()
    assert first[0][:32] != second[0][:32]
    with pytest.raises(SystemExit):
        _args("sim", ["--shared-prefix", "3", "--conversations", "2"])  # one workload source
