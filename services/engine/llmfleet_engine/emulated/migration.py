"""The emulated engine's KV transfer: a chunk is a token range and its block ids, not K/V bytes, and
it takes ``kv_bytes / link bandwidth`` on the wall clock; the destination only reserves the blocks."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmfleet_engine.emulated.clock import WallClock
from llmfleet_engine.migration_ops import MigrationOps
from llmfleet_engine.outputs import TransferError
from llmfleet_engine.transfer import ImportHandle, TransferHeader

if TYPE_CHECKING:
    pass

_RANGE = struct.Struct("<qqi")  # start, end, number of block ids that follow (int32 each)


@dataclass(eq=False)
class EmulatedMigration(MigrationOps):
    """The native migration ops with block-table chunks sent at ``link_bytes_per_s``."""

    clock: WallClock
    link_bytes_per_s: float
    # request -> (transfer start, K/V bytes so far)
    sent: dict[str, tuple[float, int]] = field(default_factory=dict, init=False)

    def forget(self, request_id: str) -> None:
        self.sent.pop(request_id, None)

    def link_seconds(self, nbytes: int) -> float:
        """How long ``nbytes`` take on the emulated link."""
        return nbytes / self.link_bytes_per_s

    def wire_bytes_per_token(self, header: TransferHeader) -> int:
        return 0  # a chunk is a block-table range, whatever its size in K/V

    def export_kv(self, request_id: str, start: int, end: int) -> bytes:
        """Tokens [start, end) of a paused request as its token range and block ids, sent at the
        emulated link's speed: this call returns when the range's K/V would have arrived."""
        with self.table.cond:
            r, table = self._kv_range_locked(request_id, start, end)
            t = table.tokens_per_block
            blocks = list(table.blocks[start // t : -(-end // t)])
            t0, sent = self.sent.get(request_id, (self.clock.monotonic(), 0))
            sent += (end - start) * r.model.shape.bytes_per_token
            self.sent[request_id] = (t0, sent)
        self.clock.sleep_until(t0 + self.link_seconds(sent))
        return _RANGE.pack(start, end, len(blocks)) + struct.pack(f"<{len(blocks)}i", *blocks)

    def resume_request(self, request_id: str, *, moving: bool = False) -> bool:
        with self.table.cond:
            self.sent.pop(request_id, None)
        return super().resume_request(request_id, moving=moving)

    def check_chunk(self, header: TransferHeader, start: int, num_tokens: int, data: bytes) -> None:
        if len(data) < _RANGE.size:
            raise TransferError(f"emulated KV chunk of {len(data)} bytes: shorter than its range header")
        s, e, n = _RANGE.unpack_from(data)
        if (s, e) != (start, start + num_tokens) or len(data) != _RANGE.size + 4 * n:
            raise TransferError(
                f"emulated KV chunk describes tokens [{s}, {e}) with {n} blocks in {len(data)} bytes; "
                f"expected tokens [{start}, {start + num_tokens})"
            )

    def write_import(self, handle: ImportHandle, start: int, data: bytes) -> None:
        pass  # the blocks were reserved by begin_import; there are no K/V bytes to place
