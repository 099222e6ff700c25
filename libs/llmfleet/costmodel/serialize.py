"""``ProfileRecord``: the fitted coefficients of one (model, hardware, engine) as stored under
``profiles/{model}/{hardware}``, with JSON round trip, and the roofline default in the same structure.

The record's date is an ISO string passed in; only :func:`record_from_fit` / :func:`roofline_record`
read the clock, and only when no date is given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmfleet.costmodel.aladdin import DecodeModel, KvModel, PrefillModel, fit_decode, fit_prefill
from llmfleet.costmodel.fit import FitReport
from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.models import ModelArch
from llmfleet.costmodel.profile_fit import EngineProfileFit
from llmfleet.costmodel.roofline import decode_time, prefill_time
from llmfleet.costmodel.scls import SclsDecode, SclsPrefill, fit_scls_decode, fit_scls_prefill

SOURCES = ("fitted", "roofline", "vidur", "calibrated")  # fitted on an engine, or a cost source's
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AladdinCoefficients:
    prefill: PrefillModel
    decode: DecodeModel
    kv: KvModel | None = None


@dataclass(frozen=True)
class SclsCoefficients:
    prefill: SclsPrefill
    decode: SclsDecode


@dataclass(frozen=True)
class ProfileRecord:
    """Coefficients of every form for one model on one hardware type behind one engine."""

    model: str
    hardware: str
    engine: str
    date: str  # ISO 8601
    source: str  # "fitted", or the cost source the forms were fitted to (costmodel.sources)
    aladdin: AladdinCoefficients
    scls: SclsCoefficients
    reports: dict[str, FitReport] = field(default_factory=dict)
    tp: int = 1

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        datetime.fromisoformat(self.date)  # raises ValueError on a malformed date

    @property
    def key(self) -> str:
        """The etcd key suffix: ``profiles/{model}/{hardware}``."""
        return f"profiles/{self.model}/{self.hardware}"

    def to_dict(self) -> dict[str, Any]:
        a = self.aladdin
        return {
            "version": SCHEMA_VERSION,
            "model": self.model,
            "hardware": self.hardware,
            "engine": self.engine,
            "date": self.date,
            "source": self.source,
            "tp": self.tp,
            "aladdin": {
                "prefill": a.prefill.to_dict(),
                "decode": a.decode.to_dict(),
                "kv": a.kv.to_dict() if a.kv is not None else None,
            },
            "scls": {"prefill": self.scls.prefill.to_dict(), "decode": self.scls.decode.to_dict()},
            "reports": {k: r.to_dict() for k, r in self.reports.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfileRecord:
        if d.get("version", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise ValueError(f"unsupported profile record version {d.get('version')!r}")
        a, s = d["aladdin"], d["scls"]
        return cls(
            model=d["model"],
            hardware=d["hardware"],
            engine=d["engine"],
            date=d["date"],
            source=d["source"],
            tp=int(d.get("tp", 1)),
            aladdin=AladdinCoefficients(
                PrefillModel(**a["prefill"]),
                DecodeModel(**a["decode"]),
                KvModel(**a["kv"]) if a.get("kv") is not None else None,
            ),
            scls=SclsCoefficients(SclsPrefill(**s["prefill"]), SclsDecode(**s["decode"])),
            reports={k: FitReport.from_dict(r) for k, r in d.get("reports", {}).items()},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProfileRecord:
        return cls.from_dict(json.loads(text))


def save_record(record: ProfileRecord, path: str | Path) -> None:
    Path(path).write_text(record.to_json() + "\n")


def load_record(path: str | Path) -> ProfileRecord:
    return ProfileRecord.from_json(Path(path).read_text())


def _date(date: str | None) -> str:
    return date if date is not None else datetime.now(UTC).isoformat(timespec="seconds")


def record_from_fit(
    fit: EngineProfileFit,
    model: str,
    hardware: str,
    engine: str,
    kv: KvModel | None = None,
    date: str | None = None,
    tp: int = 1,
) -> ProfileRecord:
    """Wrap :func:`~llmfleet.costmodel.profile_fit.fit_engine_profile` output as a ``fitted`` record."""
    return ProfileRecord(
        model=model,
        hardware=hardware,
        engine=engine,
        date=_date(date),
        source="fitted",
        tp=tp,
        aladdin=AladdinCoefficients(fit.aladdin_prefill, fit.aladdin_decode, kv),
        scls=SclsCoefficients(fit.scls_prefill, fit.scls_decode),
        reports=dict(fit.reports),
    )


PREFILL_BATCHES = (1, 2, 4, 8)
PREFILL_LENGTHS = (64, 128, 256, 512, 1024, 2048)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXTS = (128, 256, 512, 1024, 2048, 4096)


def roofline_record(
    arch: ModelArch, hw: Hardware, tp: int = 1, engine: str = "roofline", date: str | None = None
) -> ProfileRecord:
    """Fit the Aladdin and SCLS forms to roofline points so consumers get the usual structure.

    Decode points whose KV does not fit next to the weights in tp·mem_bytes are dropped (all are kept
    if fewer than 8 would remain). KV is exact: h = kv_bytes_per_token, j = 0.
    """
    return forms_record(
        arch,
        hw,
        tp,
        lambda b, ln: prefill_time(arch, hw, b * ln, tp, [ln] * b),
        lambda b, ln: decode_time(arch, hw, b, ln, tp),
        "roofline",
        engine,
        date,
    )


def forms_record(
    arch: ModelArch,
    hw: Hardware,
    tp: int,
    prefill: Any,
    decode: Any,
    source: str,
    engine: str,
    date: str | None,
) -> ProfileRecord:
    """The Aladdin and SCLS forms fitted to ``prefill(b, l)`` (b prompts of l tokens) and ``decode(b, l)``
    (b sequences of context l) seconds on the record's grid (see :func:`roofline_record`)."""
    free = tp * hw.mem_bytes - arch.weight_bytes
    pre = [(b, ln, prefill(b, ln)) for b in PREFILL_BATCHES for ln in PREFILL_LENGTHS]
    grid = [(b, ln) for b in DECODE_BATCHES for ln in DECODE_CONTEXTS]
    fits = [(b, ln) for b, ln in grid if b * ln * arch.kv_bytes_per_token <= free]
    dec = [(b, ln, decode(b, ln)) for b, ln in (fits if len(fits) >= 8 else grid)]
    a_pre, r1 = fit_prefill([(b * ln, t) for b, ln, t in pre])
    a_dec, r2 = fit_decode(dec)
    s_pre, r3 = fit_scls_prefill(pre)
    s_dec, r4 = fit_scls_decode(dec)
    return ProfileRecord(
        model=arch.name,
        hardware=hw.name,
        engine=engine,
        date=_date(date),
        source=source,
        tp=tp,
        aladdin=AladdinCoefficients(a_pre, a_dec, KvModel(h=float(arch.kv_bytes_per_token), j=0.0)),
        scls=SclsCoefficients(s_pre, s_dec),
        reports={"aladdin.prefill": r1, "aladdin.decode": r2, "scls.prefill": r3, "scls.decode": r4},
    )
