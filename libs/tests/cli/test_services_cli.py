"""`llmfleet apply` and `llmfleet services`: file validation naming the field, the created/updated/
unchanged diff, and the commands against a real etcd (exit codes 0/1/2, all-or-nothing writes)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from llmfleet.cli.apply import ApplyError, parse_services_file, plan_apply
from llmfleet.cli.main import main
from llmfleet.cli.services import decode_state, describe, render_table
from llmfleet.coord.desired import ModelEntry
from llmfleet.coord.keys import Keys
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import DesiredPlacement, ModelSpec, NodeRecord, Slo

GOOD = """
services:
  qa:
    model: tiny-qwen2
    slo: {ttft_s: 1.5, tpot_s: 0.25}
    priority: 2
  chat:
    model: tiny-llama
models:
  tiny-qwen2: {source: "tiny://qwen2"}
"""


def parse(text: str):
    return parse_services_file(textwrap.dedent(text), "svc.yaml")


# -- parsing and validation ----------------------------------------------------------------------------


def test_a_valid_file_parses_with_the_cluster_files_defaults() -> None:
    f, notes = parse(GOOD)
    assert notes == []
    assert f.services["qa"].slo.ttft_s == 1.5 and f.services["qa"].priority == 2
    assert f.services["chat"].max_tokens == 64  # the cluster file's default
    assert f.services["chat"] == ServiceSpec("chat", "tiny-llama")  # the record etcd holds, keyed by name
    assert f.models["tiny-qwen2"].source == "tiny://qwen2"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "services: {qa: {model: m, slo: {ttft_s: -1}}}",
            "svc.yaml: services.qa.slo: ttft_s must be a positive",
        ),
        ("services: {qa: {model: m, slo: {ttft_s: 0}}}", "ttft_s must be a positive number, got 0"),
        ("services: {qa: {model: m, sloo: {}}}", "services.qa.sloo: Unexpected keyword argument"),
        (
            "services: {qa: {model: m, default_max_tokens: 8}}",
            "services.qa: default_max_tokens was renamed: write max_tokens",
        ),
        ("services: {qa: {model: m, priority: high}}", "services.qa.priority: "),
        ("services: {qa: {slo: {}}}", "services.qa.model: Field required"),
        ("services: {qa: {model: m, dispatch: nope}}", "unknown dispatch policy 'nope'"),
        ("models: {m: {source: x}}", "services: Field required"),
        ("services: {}\nmodels: {m: {sorce: x}}", "models.m.sorce: Extra inputs"),
        ("services: {}\nextra: 1", "extra: Extra inputs"),
        ("services: [qa]", "services: Input should be a valid dictionary"),
        ("- a\n- b", "must be a mapping"),
        ("services: {qa: {model: m}", "not valid YAML"),
        ("services: {'a/b': {model: m}}", "services.a/b: invalid name"),
    ],
)
def test_an_invalid_file_is_an_error_naming_the_field(text: str, where: str) -> None:
    with pytest.raises(ApplyError) as e:
        parse(text)
    assert where in str(e.value)


def test_a_whole_cluster_file_applies_its_services_and_notes_the_bootstrap_sections() -> None:
    text = Path("deploy/local/cluster.yaml").read_text()
    f, notes = parse_services_file(text, "cluster.yaml")
    assert set(f.services) == {"chat", "summarize"}
    assert [n.split("ignoring ")[1].split(":")[0] for n in notes] == [
        "engines",
        "placement",
        "migration",
        "scheduler",
    ]


# -- the diff ------------------------------------------------------------------------------------------


def chat(ttft: float = 5.0) -> ServiceSpec:
    return ServiceSpec("chat", "tiny-llama", Slo(ttft_s=ttft, tpot_s=0.5))


LLAMA = ModelEntry("tiny-llama", "tiny://llama")


def test_plan_says_created_updated_and_unchanged_with_the_fields_that_change() -> None:
    f, _ = parse(GOOD)
    plan = plan_apply(f, {"chat": chat(ttft=2.0)}, {"tiny-llama": LLAMA})
    lines = [c.line() for c in plan.changes]
    assert lines == [
        "model tiny-qwen2 created",
        "service chat updated: slo.ttft_s: 2 -> 5",
        "service qa created",
    ]
    assert [s.name for s in plan.services] == ["chat", "qa"]
    assert plan.services[1] == ServiceSpec("qa", "tiny-qwen2", Slo(ttft_s=1.5, tpot_s=0.25), priority=2)
    assert [m.name for m in plan.models] == ["tiny-qwen2"]
    assert plan.summary == "2 created, 1 updated, 0 unchanged"
    again = plan_apply(
        f, {s.name: s for s in plan.services}, {"tiny-llama": LLAMA, "tiny-qwen2": plan.models[0]}
    )
    assert again.summary == "0 created, 0 updated, 3 unchanged" and not again.services and not again.models


def test_a_service_on_an_undeclared_model_is_refused() -> None:
    f, _ = parse("services: {qa: {model: tiny-mistral}}")
    with pytest.raises(ApplyError, match=r"services\.qa\.model: unknown model 'tiny-mistral'.*tiny-llama"):
        plan_apply(f, {}, {"tiny-llama": LLAMA})


# -- rendering -----------------------------------------------------------------------------------------


def state():
    k = Keys("/p")
    qa = ServiceSpec("qa", "tiny-qwen2", Slo(ttft_s=1.5, tpot_s=0.25))
    return decode_state(
        k,
        {k.service("chat"): chat().to_json(), k.service("qa"): qa.to_json(), k.service("bad"): b"{"},
        {k.model("tiny-llama"): LLAMA.to_json()},
        {k.placement("e0"): DesiredPlacement("e0", (ModelSpec("tiny-llama", "tiny://llama"),)).to_json()},
        {k.node("e0"): NodeRecord("e0", "engine", "x:1", models=("tiny-llama",)).to_json()},
    )


def test_list_shows_the_engines_hosting_each_service_or_unplaced() -> None:
    out = render_table(state()).splitlines()
    assert out[0].split() == ["NAME", "MODEL", "TTFT_S", "TPOT_S", "DEADLINE_S", "PRIORITY", "ENGINES"]
    assert out[1].split() == ["chat", "tiny-llama", "5", "0.5", "-", "0", "e0"]
    assert out[2].split() == ["qa", "tiny-qwen2", "1.5", "0.25", "-", "0", "unplaced"]
    assert out[3].startswith("warning: undecodable /p/services/bad")


def test_describe_gives_the_spec_model_and_placement() -> None:
    d = describe(state(), "chat")
    assert d["service"]["slo"]["ttft_s"] == 5.0 and d["model"]["source"] == "tiny://llama"
    assert d["placed_on"] == ["e0"] and d["loaded_on"] == ["e0"]
    assert describe(state(), "qa")["model"] is None


# -- the commands against etcd -------------------------------------------------------------------------


@pytest.fixture
def cli(etcd_settings, capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        flags = ["--etcd", etcd_settings.endpoints[0], "--prefix", etcd_settings.prefix]
        code = main([*argv, *flags])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_apply_list_describe_delete(cli, tmp_path: Path) -> None:
    f = tmp_path / "svc.yaml"
    # chat's model is neither in the file nor in etcd: the whole batch is refused, nothing written
    f.write_text(GOOD)
    code, out, err = cli("apply", "-f", str(f))
    assert code == 1 and "services.chat.model: unknown model 'tiny-llama'" in err
    assert cli("services", "list")[1].splitlines()[-1] == "(no services)"

    f.write_text(GOOD + '  tiny-llama: {source: "tiny://llama"}\n')
    code, out, err = cli("apply", "-f", str(f), "--dry-run")
    assert code == 0 and "dry run: 4 created, 0 updated, 0 unchanged; nothing written" in out, err
    assert json.loads(cli("services", "list", "--json")[1]) == []  # the dry run wrote nothing
    code, out, err = cli("apply", "-f", str(f))
    assert code == 0, err
    assert out.splitlines() == [
        "model tiny-llama created",
        "model tiny-qwen2 created",
        "service chat created",
        "service qa created",
        "applied: 4 created, 0 updated, 0 unchanged",
    ]
    assert "no placement leader has seeded" in err
    rows = {r["name"]: r for r in json.loads(cli("services", "list", "--json")[1])}
    assert rows["qa"]["ttft_s"] == 1.5 and rows["qa"]["placed_on"] == []

    f.write_text(f.read_text().replace("ttft_s: 1.5", "ttft_s: 0.75"))
    code, out, _ = cli("apply", "-f", str(f))
    assert "service qa updated: slo.ttft_s: 1.5 -> 0.75" in out and "1 updated, 3 unchanged" in out
    code, out, _ = cli("services", "describe", "qa")
    doc = yaml.safe_load(out)
    assert code == 0 and doc["service"]["slo"]["ttft_s"] == 0.75 and doc["model"]["source"] == "tiny://qwen2"

    code, out, _ = cli("services", "delete", "qa")
    assert code == 0 and out.startswith("service qa deleted")
    code, out, err = cli("services", "delete", "qa")
    assert code == 1 and "no service 'qa' (known: chat)" in err
    code, _, err = cli("services", "describe", "nope")
    assert code == 1 and "no service 'nope'" in err
    assert [r["name"] for r in json.loads(cli("services", "list", "--json")[1])] == ["chat"]


def test_a_bad_file_fails_before_etcd_is_asked(tmp_path: Path, capsys) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text("services: {qa: {model: m, slo: {ttft_s: -2}}}")
    assert main(["apply", "-f", str(f), "--etcd", "127.0.0.1:1"]) == 1
    assert "services.qa.slo: ttft_s must be a positive number, got -2" in capsys.readouterr().err
    assert main(["apply", "-f", str(tmp_path / "missing.yaml"), "--etcd", "127.0.0.1:1"]) == 1


def test_etcd_unreachable_is_exit_2_naming_the_endpoint(tmp_path: Path, capsys) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text(GOOD)
    for argv in (["apply", "-f", str(f)], ["services", "list"], ["services", "delete", "x"]):
        assert main([*argv, "--etcd", "127.0.0.1:1", "--timeout", "1"]) == 2
        assert "cannot reach etcd at 127.0.0.1:1" in capsys.readouterr().err
