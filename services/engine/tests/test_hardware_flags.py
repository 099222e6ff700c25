"""The engine registers its hardware and GPU count: ``--hardware`` (a catalog name, else a config error
listing the valid ones; default cpu, or guessed from the GPU's name) and ``--tp`` in its node record."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from llmfleet_engine import hardware, main


def parse(argv: list[str]):
    return main.build_parser().parse_args(argv)


def test_hardware_flag_takes_catalog_names():
    assert parse(["--hardware", "A100-80GB"]).hardware == "a100-80gb"
    assert parse(["--hardware", "cpu"]).hardware == "cpu"
    assert parse([]).hardware is None and parse([]).tp == 1


def test_unknown_hardware_is_a_config_error_listing_the_valid_names(capsys):
    with pytest.raises(SystemExit):
        parse(["--hardware", "tpu-v9"])
    err = capsys.readouterr().err
    assert "unknown hardware 'tpu-v9'" in err and "h100" in err and "a100-80gb" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tp", "3"], "power of two"),
        (["--tp", "0"], "power of two"),
        (["--tp", "2"], "the native backend runs on one device"),
    ],
)
def test_bad_tp(argv, needle, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert needle in capsys.readouterr().err


def test_tp_reaches_vllm(monkeypatch):
    args = parse(["--tp", "4", "--backend", "vllm"])
    assert args.tp == 4
    fake = types.ModuleType("llmfleet_engine.vllm_backend")
    fake.VllmConfig = lambda **kw: kw
    fake.VllmExecutor = lambda config: config
    monkeypatch.setitem(sys.modules, "llmfleet_engine.vllm_backend", fake)
    assert main.make_executor(args)["tensor_parallel_size"] == 4


def test_detect_hardware(monkeypatch):
    assert hardware.detect_hardware("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    names = {"name": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names["name"])
    assert hardware.detect_hardware("cuda:0", 80 << 30) == "h100"
    names["name"] = "NVIDIA A100-SXM4-40GB"
    assert hardware.detect_hardware("cuda", 2 * (40 << 30), tp=2) == "a100-40gb"
    names["name"] = "Some Future GPU"
    assert hardware.detect_hardware("cuda:0", 1 << 30) == "Some Future GPU"  # the raw name


class FakeHost:
    kv_capacity_bytes = 1 << 30
    on_models_changed: list = []

    def serving_model_names(self) -> tuple[str, ...]:
        return ("tiny-llama",)


class FakeBackend:
    device = "cpu"
    memory_bytes = 8 << 30
    host = FakeHost()
    migration = None

    def load_snapshot(self):  # read only when /metrics is scraped
        raise NotImplementedError

    def attach_metrics(self, metrics) -> None:  # the gauges read load_snapshot at scrape time
        metrics.attach(self.load_snapshot)

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("argv, want", [([], "cpu"), (["--hardware", "l4"], "l4")])
def test_node_record_carries_hardware_and_tp(argv, want, monkeypatch):
    monkeypatch.setattr(main, "make_executor", lambda args: FakeBackend())
    node, _ = main.build_node(parse(["--id", "e0", "--port", "0", *argv]))
    rec = node.record()
    assert (rec.hardware, rec.tp, rec.device, rec.memory_bytes) == (want, 1, "cpu", 8 << 30)
