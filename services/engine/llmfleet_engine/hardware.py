"""What an engine registers about its hardware: the catalog name (``--hardware``, else guessed from
the device) and its GPU count (``--tp``), for the engine pool the placement leader plans over."""

from __future__ import annotations

import argparse

from llmfleet.costmodel.hardware import UnknownHardware, hardware
from llmfleet.monitor.pool import guess_hardware


def hardware_name(text: str) -> str:
    """``--hardware``: a catalog name (any case/punctuation), returned canonical; else the valid names."""
    try:
        return hardware(text).name
    except UnknownHardware as e:
        raise argparse.ArgumentTypeError(e.args[0]) from None


def tp_degree(text: str) -> int:
    """``--tp``: a power of two >= 1."""
    try:
        tp = int(text)
    except ValueError:
        tp = 0
    if tp < 1 or tp & (tp - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two >= 1, got {text!r}")
    return tp


def detect_hardware(device: str, memory_bytes: int = 0, tp: int = 1) -> str:
    """ "cpu" off CUDA; on CUDA the catalog name guessed from the device's name (``memory_bytes`` is
    the whole engine's, over ``tp`` GPUs), or the raw device name when no catalog entry matches."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return device
    name = torch.cuda.get_device_name(torch.device(device))
    return guess_hardware(name, memory_bytes // max(tp, 1)) or name
