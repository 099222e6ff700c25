"""Flags generated from spec sections: each field one flag with the field's default and help, read
back into the section, written by ``llmfleet up`` as the command line that gives a section."""

from __future__ import annotations

import argparse
from typing import Any, Literal

import pytest
from llmfleet.cli.sim_args import POLICY_FLAGS
from llmfleet.spec.engines import EMULATED_FLAGS, ENGINE_FLAGS, EmulatedPool, EngineConfig
from llmfleet.spec.flags import SectionFlags
from llmfleet.spec.live_loops import (
    MIGRATION_FLAGS,
    PLACEMENT_FLAGS,
    SCHEDULER_FLAGS,
    MigrationConfig,
    SchedulerConfig,
)
from llmfleet.spec.sections import DispatchSpec
from pydantic import BaseModel, ConfigDict, Field

SHIPPED = [PLACEMENT_FLAGS, MIGRATION_FLAGS, SCHEDULER_FLAGS, ENGINE_FLAGS, EMULATED_FLAGS, POLICY_FLAGS]


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["a", "b"] = Field("a", description="which mode")
    size: int = Field(3, ge=1, description="how many, 100% of them")


class Toy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    on: bool = Field(True, description="a switch")
    limit: float | None = Field(None, gt=0, description="a bound (unset: none)")
    options: dict[str, Any] = Field(default_factory=dict, description="constructor options")
    inner: Inner = Field(default_factory=Inner)
    kept: int = 0


TOY = SectionFlags(Toy, names={"inner.mode": "mode"}, skip={"kept"})


def _parser(flags: SectionFlags) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="t")
    flags.add(ap)
    return ap


def _fields(
    model: type[BaseModel], whole: frozenset[str] = frozenset(), path: tuple[str, ...] = ()
) -> set[str]:
    """Every field key of a section, nested sections' fields included (but those in `whole`)."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        key, ann = ".".join((*path, name)), info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and key not in whole:
            out |= _fields(ann, whole, (*path, name))
        else:
            out.add(key)
    return out


def test_each_field_is_a_flag_with_its_default_and_help() -> None:
    ap = _parser(TOY)
    assert [f.option for f in TOY.flags] == ["--on", "--limit", "--options", "--mode", "--inner-size"]
    ns = ap.parse_args([])
    assert (ns.on, ns.limit, ns.options, ns.mode, ns.inner_size) == (True, None, {}, "a", 3)
    assert TOY.read(ns) == Toy()
    text = ap.format_help()
    assert "a switch (default: True)" in text and "how many, 100% of them (default: 3)" in text
    assert "{a,b}" in text and "--no-on" in text and "--kept" not in text


def test_values_are_checked_by_the_field_and_errors_name_the_flag(capsys: pytest.CaptureFixture) -> None:
    ap = _parser(TOY)
    ns = ap.parse_args(
        ["--no-on", "--limit", "2.5", "--options", '{"x": 1}', "--mode", "b", "--inner-size", "7"]
    )
    assert TOY.read(ns) == Toy(on=False, limit=2.5, options={"x": 1}, inner=Inner(mode="b", size=7))
    for argv, message in [
        (["--inner-size", "0"], "argument --inner-size: Input should be greater than or equal to 1"),
        (["--limit", "-1"], "argument --limit: Input should be greater than 0"),
        (["--options", "[1]"], "argument --options: must be a JSON object"),
        (["--mode", "c"], "argument --mode: invalid choice: 'c'"),
    ]:
        with pytest.raises(SystemExit):
            ap.parse_args(argv)
        assert message in capsys.readouterr().err


def test_a_section_it_refuses_names_the_flags() -> None:
    flags = SectionFlags(SchedulerConfig, names={"dispatch.policy": "dispatch"})
    ns = _parser(flags).parse_args(["--dispatch", "nowhere"])
    with pytest.raises(
        ValueError, match=r"^--dispatch, --dispatch-options: unknown dispatch policy 'nowhere'"
    ):
        flags.read(ns)


def test_overrides_change_only_what_is_given() -> None:
    flags = SectionFlags(Toy, overrides=True, key="toy", skip={"kept"})
    ap = _parser(flags)
    assert flags.given(ap.parse_args([])) == {}
    ns = ap.parse_args(["--no-on", "--inner-size", "5"])
    assert flags.given(ns) == {"on": False, "inner": {"size": 5}}
    base = Toy(limit=1.0, inner=Inner(mode="b"))
    assert flags.read(ns, base=base) == Toy(on=False, limit=1.0, inner=Inner(mode="b", size=5))
    assert "(overrides toy.inner.size)" in ap.format_help()


def test_argv_gives_the_section_back() -> None:
    section = Toy(on=False, limit=0.5, options={"b": 2, "a": 1}, inner=Inner(size=9), kept=4)
    argv = TOY.argv(section)
    assert argv == [
        "--no-on",
        "--limit",
        "0.5",
        "--options",
        '{"a": 1, "b": 2}',
        "--mode",
        "a",
        "--inner-size",
        "9",
    ]
    assert TOY.read(_parser(TOY).parse_args(argv), kept=4) == section
    assert TOY.argv(section, only={"limit"}) == ["--limit", "0.5"]


@pytest.mark.parametrize("flags", SHIPPED, ids=lambda f: f.section.__name__)
def test_every_field_of_a_shipped_section_is_a_flag_or_deliberately_not(flags: SectionFlags) -> None:
    """A field added to a section is a flag of its service (a field is left out only by name)."""
    flagged = {f.key for f in flags.flags}
    assert flagged | set(flags.skip) == _fields(flags.section, frozenset({*flags.whole, *flags.skip}))
    assert not flagged & set(flags.skip)
    assert all(f.info.description for f in flags.flags), "the help comes from the field's description"


@pytest.mark.parametrize("flags", [f for f in SHIPPED if not f.overrides], ids=lambda f: f.section.__name__)
def test_the_generated_defaults_are_the_spec_defaults(flags: SectionFlags) -> None:
    ns = _parser(flags).parse_args([])
    default = flags.section()
    for f in flags.flags:
        value: Any = default
        for part in f.path:
            value = getattr(value, part)
        assert getattr(ns, f.dest) == value, f.option
    assert flags.read(ns) == default


@pytest.mark.parametrize(
    ("flags", "section"),
    [
        (SCHEDULER_FLAGS, SchedulerConfig(binding="early", queue_slack=1, kv_room_fraction=0.5, move_queued=True,
                                          cold_start=False, dispatch=DispatchSpec(policy="power_of_two",
                                                                                  options={"seed": 3}),
                                          ready_when="started")),
        (MIGRATION_FLAGS, MigrationConfig(policy="mell", options={"batching": False}, epoch_s=2.5, transfer="kv",
                                          max_concurrency=2, load_interval_s=0.25)),
        (ENGINE_FLAGS, EngineConfig(policy="static_sls", options={"batch_size": 4}, max_running=9, watermark=0.1,
                                    block_bytes="64KiB", prefix_caching=False, stream_interval_s=0.01, threads=2)),
        (EMULATED_FLAGS, EmulatedPool(cost_source="roofline", mem_fraction=0.8)),
    ],
)  # fmt: skip
def test_what_up_writes_the_service_reads_back(flags: SectionFlags, section: BaseModel) -> None:
    assert flags.read(_parser(flags).parse_args(flags.argv(section))) == section


def test_the_simulators_flags_override_one_field_each() -> None:
    ap = _parser(POLICY_FLAGS)
    argv = ["--dispatch", "jsq", "--placement-interval-s", "60", "--adaptive-interval", "--transfer", "kv"]
    given = POLICY_FLAGS.given(ap.parse_args([*argv, "--binding", "late", "--queue-slack", "2"]))
    assert given == {
        "dispatch": {"policy": "jsq"},
        "placement": {"interval_s": 60.0, "adaptive_interval": True},
        "migration": {"transfer": "kv"},
        "capacity": {"binding": "late", "queue_slack": 2},
    }
