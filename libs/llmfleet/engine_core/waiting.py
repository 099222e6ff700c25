"""An engine's waiting queue: its requests in arrival order, by id, with the KV blocks their prompts
will take kept as a running sum.

A dispatcher reading KV and late binding's room check both count an engine's KV in use plus what its
queued prompts will take (``EngineCandidate.kv_waiting_bytes``). A live engine reports the second with
each load report; the simulator refreshes an instance's candidate whenever its state changes, so
there the sum is read at every step end, and kept as the queue changes it costs nothing to read.
Each request's block count is fixed when it joins (its prompt does not change while it waits:
preemption and a static batch's end fold the output in before it joins again)."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView

from llmfleet.engine_core.request import CoreRequest


class WaitingQueue:
    """Waiting requests by id, in the order they joined; :attr:`prompt_blocks` is the sum of their
    prompts' KV blocks. Read like a mapping; changed only through :meth:`add` and :meth:`pop`."""

    __slots__ = ("_blocks", "_requests", "prompt_blocks")

    def __init__(self) -> None:
        self._requests: dict[str, CoreRequest] = {}
        self._blocks: dict[str, int] = {}
        self.prompt_blocks = 0

    def add(self, r: CoreRequest, blocks: int) -> None:
        """``r`` joins the end of the queue; its prompt will take ``blocks`` KV blocks."""
        rid = r.sched.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already waiting")
        if blocks < 0:
            raise ValueError(f"blocks must be >= 0, got {blocks}")
        self._requests[rid] = r
        self._blocks[rid] = blocks
        self.prompt_blocks += blocks

    def pop(self, request_id: str) -> CoreRequest | None:
        """Take ``request_id`` out of the queue (admitted, dropped, failed); None if it is not here."""
        r = self._requests.pop(request_id, None)
        if r is not None:
            self.prompt_blocks -= self._blocks.pop(request_id)
        return r

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[str]:
        return iter(self._requests)

    def __getitem__(self, request_id: str) -> CoreRequest:
        return self._requests[request_id]

    def get(self, request_id: str) -> CoreRequest | None:
        return self._requests.get(request_id)

    def keys(self) -> KeysView[str]:
        return self._requests.keys()

    def values(self) -> ValuesView[CoreRequest]:
        return self._requests.values()

    def items(self) -> ItemsView[str, CoreRequest]:
        return self._requests.items()
