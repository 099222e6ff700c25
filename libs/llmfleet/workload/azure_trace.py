"""Loader for the Azure LLM inference traces (``TIMESTAMP,ContextTokens,GeneratedTokens`` CSV).

Timestamps are either datetimes like ``2023-11-16 18:15:46.6805900`` (any number of fractional digits
up to 9, read exactly to the nanosecond, no time zone applied) or plain numeric seconds; one file uses
one kind. Rows may be out of order: they are sorted by time (stably, so ties keep file order) and
arrivals are seconds since the earliest row. Each request's id is ``f"{id_prefix}{line}"``, its 1-based
line in the file (the header is line 1), whatever its position after sorting.

Rows with ``GeneratedTokens == 0`` occur in the published traces. By default they are clamped to 1
output token (``zero_output="clamp"``): the request still arrived and was prefilled, and the engine
emits at least one token, so dropping it would thin the arrival process. ``"skip"`` drops them and
``"error"`` rejects them; the count clamped or skipped is logged at INFO level.

An optional ``Service`` column names each row's service (a replay keeps a label that names one of its
services, e.g. a mix of many services written by a benchmark); rows without it get ``service``.
"""

from __future__ import annotations

import csv
import datetime as dt
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmfleet.workload.arrivals import replay_index
from llmfleet.workload.request import Workload, WorkloadRequest

log = logging.getLogger(__name__)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SERVICE_COLUMN = "Service"  # optional: the row's service
ZeroOutput = Literal["clamp", "skip", "error"]

_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z?")
_EPOCH = dt.date(1970, 1, 1)


class TraceFormatError(ValueError):
    """A malformed trace row; the message names the file, the 1-based line and the bad value."""

    def __init__(self, path: Path, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line


@dataclass(frozen=True)
class TraceRecord:
    """One trace row: its file line, seconds since the earliest row, and its token counts as written."""

    line: int
    offset_s: float
    prompt_tokens: int
    output_tokens: int
    service: str = ""  # the Service column ("": none)


def _datetime_ns(text: str) -> int | None:
    """Nanoseconds since 1970-01-01 of a zone-less datetime, or None if ``text`` is not one."""
    m = _DATETIME.fullmatch(text)
    if m is None:
        return None
    date_s, hh, mm, ss, frac = m.groups()
    try:
        days = (dt.date.fromisoformat(date_s) - _EPOCH).days
    except ValueError:
        return None
    h, mi, s = int(hh), int(mm), int(ss)
    if h > 23 or mi > 59 or s > 59:
        return None
    seconds = days * 86400 + h * 3600 + mi * 60 + s
    return seconds * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


def _numeric_s(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _tokens(path: Path, line: int, column: str, text: str) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        raise TraceFormatError(path, line, f"{column} must be an integer, got {text!r}") from None
    if v < 0:
        raise TraceFormatError(path, line, f"{column} must be >= 0, got {v}")
    return v


def read_azure_trace(path: str | Path) -> tuple[TraceRecord, ...]:
    """Parse and validate every row, sorted by time (stable). Token counts are returned as written."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Azure trace not found: {p}")
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise ValueError(
                f"{p}: missing column(s) {missing}; expected {list(AZURE_COLUMNS)}, found {header}"
            )
        i_ts, i_in, i_out = (header.index(c) for c in AZURE_COLUMNS)
        i_svc = header.index(SERVICE_COLUMN) if SERVICE_COLUMN in header else None
        kind: str | None = None  # "datetime" or "numeric", fixed by the first row
        raw: list[tuple[int, float | int, int, int, str]] = []
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                raise TraceFormatError(p, line, f"expected {len(header)} fields, got {len(row)}: {row!r}")
            text = row[i_ts].strip()
            t: float | int | None = _datetime_ns(text) if kind != "numeric" else None
            if t is not None:
                kind = kind or "datetime"
            elif kind != "datetime" and (t := _numeric_s(text)) is not None:
                kind = kind or "numeric"
            else:
                want = {"datetime": "a datetime", "numeric": "numeric seconds"}.get(kind or "", "")
                expect = f" (this file's timestamps are {want})" if want else ""
                raise TraceFormatError(p, line, f"bad TIMESTAMP {row[i_ts]!r}{expect}")
            raw.append(
                (
                    line,
                    t,
                    _tokens(p, line, "ContextTokens", row[i_in]),
                    _tokens(p, line, "GeneratedTokens", row[i_out]),
                    row[i_svc].strip() if i_svc is not None else "",
                )
            )
    raw.sort(key=lambda r: r[1])  # stable: equal times keep file order
    if not raw:
        return ()
    t0, per_s = raw[0][1], (1e9 if kind == "datetime" else 1.0)
    return tuple(TraceRecord(line, (t - t0) / per_s, pin, pout, svc) for line, t, pin, pout, svc in raw)


def load_azure_trace(
    path: str | Path,
    *,
    start_s: float = 0.0,
    end_s: float | None = None,
    limit: int | None = None,
    rate_scale: float = 1.0,
    service: str = "default",
    model: str = "",
    zero_output: ZeroOutput = "clamp",
    id_prefix: str = "azure-",
) -> Workload:
    """The trace as a ``Workload``.

    Order of operations: rows in [start_s, end_s) of trace time (seconds since the earliest row) are
    kept and re-based so that start_s is t = 0; arrivals are then divided by ``rate_scale`` (2.0 = twice
    the rate); zero-output rows are handled per ``zero_output``; finally the first ``limit`` are kept.
    """
    if zero_output not in ("clamp", "skip", "error"):
        raise ValueError(f"zero_output must be 'clamp', 'skip' or 'error', got {zero_output!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")
    records = read_azure_trace(path)
    idx, arrivals = replay_index(
        [r.offset_s for r in records], rate_scale=rate_scale, start_s=start_s, end_s=end_s
    )
    reqs: list[WorkloadRequest] = []
    zeros = 0
    for i, t in zip(idx.tolist(), arrivals.tolist(), strict=True):
        if limit is not None and len(reqs) >= limit:
            break
        rec = records[i]
        out = rec.output_tokens
        if out == 0:
            if zero_output == "error":
                raise TraceFormatError(Path(path), rec.line, "GeneratedTokens is 0 (zero_output='error')")
            zeros += 1
            if zero_output == "skip":
                continue
            out = 1
        reqs.append(
            WorkloadRequest(
                f"{id_prefix}{rec.line}", t, rec.prompt_tokens, out, rec.service or service, model
            )
        )
    if zeros:
        verb = "skipped" if zero_output == "skip" else "clamped to 1"
        log.info("%s: %d row(s) with GeneratedTokens=0 %s", path, zeros, verb)
    return Workload(tuple(reqs))
