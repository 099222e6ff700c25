"""The simulator hands a dispatch policy that reads prompts each request's prompt text and session, on
arrival and when a request held for capacity (late binding) is dispatched later; a policy that reads
no prompt gets none (the text is not rendered for it)."""

from __future__ import annotations

from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import JoinShortestQueue, PrefixAffinity
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.workload import WorkloadRequest as W
from llmfleet.workload.prompts import prompt_text

S7 = SimService("s", "llama2-7b")
PLAN = [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)]


class Seen:
    """Records the prompt and session of every dispatch request it is asked about."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.needs = inner, inner.name, inner.needs
        self.seen: list[tuple[str, str, str]] = []
        self.later = 0  # dispatched after arriving (held for capacity first)
        self.cached: set[int | None] = set()  # the prefix-cache sizes the candidates reported

    def choose(self, model, candidates, exclude=frozenset(), request=None):
        self.seen.append((request.request_id, request.prompt, request.session))
        self.cached.update(c.prefix_cached_bytes for c in candidates)
        self.later += request.arrival_s > 0  # every request arrives at 0
        return self.inner.choose(model, candidates, exclude, request)


def work() -> list[W]:
    return [W(f"r{i}", 0.0, 300, 40, "s", system_tokens=300, session=f"c{i % 3}") for i in range(24)]


def run(tiny, policy, late: bool) -> Seen:
    spec = tiny.spec(services=(S7,), cluster="2xA100-80GB", engine=EngineSettings(max_running=4))
    seen = Seen(policy)
    sim = Simulator(spec, PLAN, Fcfs, seen, tiny.book(spec))
    if late:
        sim.fleet.set_binding("late", Saturation(queue_slack=2))
    res = sim.run(work(), strict_services=True)
    assert all(r.done for r in res.records)
    return seen


def test_prompt_reading_policies_see_every_prompt_held_ones_included(tiny) -> None:
    text = prompt_text(work()[0])
    for late in (False, True):
        seen = run(tiny, PrefixAffinity(), late)
        assert {rid for rid, _, _ in seen.seen} == {f"r{i}" for i in range(24)}
        assert all(prompt == text and session for _, prompt, session in seen.seen)
        assert (seen.later > 0) == late  # late binding held some, dispatched when room came
        # the instances report their prefix caches' sizes: empty at first; those dispatched after
        # some prefills ran (held for capacity) see the prompts cached
        assert 0 in seen.cached and None not in seen.cached
        assert (max(seen.cached) > 0) == late


def test_other_policies_get_sessions_but_no_rendered_prompt(tiny) -> None:
    seen = run(tiny, JoinShortestQueue(), late=False)
    assert all(prompt == "" and session for _, prompt, session in seen.seen)
