"""Accelerator catalog for the roofline: peak dense FLOP/s, memory bandwidth, capacity, interconnect.

Peaks are datasheet numbers (dense fp16/bf16 tensor-core, no sparsity); link bandwidths are per
direction. ``h2d_bytes_per_s`` is one GPU's host-to-device link (its PCIe x16 generation: Gen3 16 GB/s,
Gen4 32 GB/s, Gen5 64 GB/s per direction), what loading weights from host memory is bound by. The efficiency factors turn peaks into attainable rates; defaults are typical of vLLM-class
engines (about 60 % MFU in prefill, 80 % of HBM bandwidth in decode, 70 % of link bandwidth in NCCL
all-reduce). Only :func:`local_cpu` measures anything, and only when called.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

GB = 1e9
TB = 1e12
GIB = 1 << 30


class UnknownHardware(KeyError):
    """A hardware name that is not in :data:`HARDWARE_CATALOG`."""


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or the CPU). Rates in FLOP/s and B/s, memory in bytes."""

    name: str
    peak_flops: float  # dense fp16/bf16 tensor FLOP/s
    mem_bandwidth: float  # B/s
    mem_bytes: int
    intra_node_bw: float  # B/s per direction (NVLink or PCIe)
    inter_node_bw: float  # B/s per direction (network)
    compute_eff: float = 0.6  # attainable fraction of peak_flops
    mem_eff: float = 0.8  # attainable fraction of mem_bandwidth
    comm_eff: float = 0.7  # attainable fraction of link bandwidth in a ring all-reduce
    gpus_per_node: int = 8  # TP groups larger than this cross the inter-node link
    h2d_bytes_per_s: float = 32 * GB  # B/s per GPU, host to device (PCIe Gen4 x16 unless set)

    def __post_init__(self) -> None:
        rates = (
            self.peak_flops,
            self.mem_bandwidth,
            self.intra_node_bw,
            self.inter_node_bw,
            self.h2d_bytes_per_s,
        )
        if min(rates) <= 0 or self.mem_bytes <= 0 or self.gpus_per_node <= 0:
            raise ValueError(f"Hardware rates and sizes must be positive: {self}")
        for eff in (self.compute_eff, self.mem_eff, self.comm_eff):
            if not 0 < eff <= 1:
                raise ValueError(f"efficiency factors must be in (0, 1]: {self}")

    @property
    def flops(self) -> float:
        """Attainable FLOP/s."""
        return self.peak_flops * self.compute_eff

    @property
    def bandwidth(self) -> float:
        """Attainable memory B/s."""
        return self.mem_bandwidth * self.mem_eff

    def link_bw(self, tp: int) -> float:
        """Attainable all-reduce link B/s for a TP group of ``tp`` devices."""
        raw = self.intra_node_bw if tp <= self.gpus_per_node else self.inter_node_bw
        return raw * self.comm_eff


_CATALOG = [
    # nvidia.com A100 datasheet: 312 TF bf16 dense, 1,555 GB/s HBM2, NVLink 600 GB/s (300/dir);
    # HDR InfiniBand 200 Gb/s = 25 GB/s; host link PCIe Gen4 x16 (SXM4 boards).
    Hardware("a100-40gb", 312 * TB, 1555 * GB, 40 * GIB, 300 * GB, 25 * GB, h2d_bytes_per_s=32 * GB),
    # A100 80GB SXM: 2,039 GB/s HBM2e.
    Hardware("a100-80gb", 312 * TB, 2039 * GB, 80 * GIB, 300 * GB, 25 * GB, h2d_bytes_per_s=32 * GB),
    # A800 80GB SXM (China export A100): same compute/HBM, NVLink 400 GB/s (200/dir), PCIe Gen4.
    Hardware("a800", 312 * TB, 2039 * GB, 80 * GIB, 200 * GB, 25 * GB, h2d_bytes_per_s=32 * GB),
    # H100 SXM datasheet: 989 TF bf16 dense, 3.35 TB/s HBM3, NVLink 900 GB/s (450/dir); NDR 400 Gb/s;
    # PCIe Gen5 x16 (64/dir).
    Hardware("h100", 989 * TB, 3350 * GB, 80 * GIB, 450 * GB, 50 * GB, h2d_bytes_per_s=64 * GB),
    # H200 SXM datasheet: 989 TF bf16 dense, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s, PCIe Gen5.
    Hardware("h200", 989 * TB, 4800 * GB, 141 * GB, 450 * GB, 50 * GB, h2d_bytes_per_s=64 * GB),
    # L4 datasheet: 121 TF fp16 dense (242 sparse), 300 GB/s GDDR6, 24 GB, PCIe Gen4 x16 (32/dir);
    # 25 GbE between nodes.
    Hardware("l4", 121 * TB, 300 * GB, 24 * GB, 32 * GB, 3.125 * GB, h2d_bytes_per_s=32 * GB),
    # RTX 4090 (Ada whitepaper): 165 TF fp16 tensor w/ fp32 accumulate dense, 1,008 GB/s, 24 GB,
    # PCIe Gen4 only (no NVLink).
    Hardware("rtx-4090", 165 * TB, 1008 * GB, 24 * GB, 32 * GB, 3.125 * GB, h2d_bytes_per_s=32 * GB),
    # V100 SXM2 32GB datasheet: 125 TF fp16 tensor, 900 GB/s HBM2, NVLink 300 GB/s (150/dir);
    # EDR InfiniBand 100 Gb/s; PCIe Gen3 x16 (16/dir).
    Hardware("v100", 125 * TB, 900 * GB, 32 * GIB, 150 * GB, 12.5 * GB, h2d_bytes_per_s=16 * GB),
    # Local CPU, conservative default (a few-core laptop): 100 GFLOP/s fp32 BLAS, 10 GB/s memcpy,
    # 16 GiB; "links" (and loading weights) are memory copies (TP on CPU is only for tests). Use
    # local_cpu() to measure.
    Hardware(
        "cpu",
        100e9,
        10 * GB,
        16 * GIB,
        10 * GB,
        1.25 * GB,
        compute_eff=1.0,
        mem_eff=1.0,
        comm_eff=1.0,
        h2d_bytes_per_s=10 * GB,
    ),
]
HARDWARE_CATALOG: dict[str, Hardware] = {h.name: h for h in _CATALOG}


def _key(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return {"h100sxm": "h100", "a800sxm": "a800", "4090": "rtx4090"}.get(key, key)


_BY_KEY = {_key(n): h for n, h in HARDWARE_CATALOG.items()}


def hardware(name: str) -> Hardware:
    """Catalog lookup ignoring case and punctuation; :class:`UnknownHardware` lists valid names."""
    hw = _BY_KEY.get(_key(name))
    if hw is None:
        raise UnknownHardware(f"unknown hardware {name!r}; valid: {sorted(HARDWARE_CATALOG)}")
    return hw


def local_cpu(size: int = 512, copy_mib: int = 64, repeats: int = 3) -> Hardware:
    """Estimate this CPU's fp32 matmul FLOP/s and copy bandwidth with a short numpy micro-benchmark.

    Takes well under a second with the defaults; best of ``repeats`` runs. Memory capacity keeps the
    catalog default (no OS query: the library does no I/O).
    """
    import numpy as np

    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    flops = 2 * size**3 / max(best, 1e-9)
    src = np.ones(copy_mib * (1 << 20) // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    bw = 2 * src.nbytes / max(best, 1e-9)  # read + write
    return replace(
        HARDWARE_CATALOG["cpu"],
        name="cpu-local",
        peak_flops=flops,
        mem_bandwidth=bw,
        intra_node_bw=bw,
        h2d_bytes_per_s=bw,
    )
