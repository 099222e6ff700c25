from llmfleet.policies.placement import StaticConfigPlacement
from llmfleet.types import DesiredPlacement, ModelSpec

A = ModelSpec("a", "tiny://llama")
B = ModelSpec("b", "tiny://qwen2")


def test_diff_puts_changed_and_deletes_unplanned():
    pol = StaticConfigPlacement((DesiredPlacement("e0", (A, B)), DesiredPlacement("e1", (A,))))
    current = {
        "e0": DesiredPlacement("e0", (A,)),
        "e1": DesiredPlacement("e1", (A,)),
        "old": DesiredPlacement("old"),
    }
    d = pol.diff(current, live_engines=["e0"])
    assert d.put == (DesiredPlacement("e0", (A, B)),)
    assert d.delete == ("old",)


def test_diff_empty_when_converged():
    plan = (DesiredPlacement("e0", (A,)),)
    pol = StaticConfigPlacement(plan)
    assert pol.diff({"e0": plan[0]}).put == ()
    assert pol.diff({"e0": plan[0]}).delete == ()
