"""FIFO static batches sized by SLO-ODBS's CM rule: the fair FIFO baseline for UELLM.

UELLM's FIFO baseline batched 10 requests while SLO-ODBS sizes its batches by CM (the batch's longest
predicted output and prompt against the free KV), so a FIFO-vs-SLO-ODBS gap measured that way is mostly
batch size. ``FifoCm`` keeps FIFO's order (arrival, then id) and no join terms, and closes a batch at
exactly :meth:`SloOdbs.cm_batch_size`'s size — the same memory (and, with a cost, SLO) bound as SLO-ODBS.
"""

from __future__ import annotations

from llmfleet.policies.batching.slo_odbs import SloOdbs, SloOdbsOptions


class FifoCm(SloOdbs):
    """FIFO order, CM-based batch size (see the module docstring); options as :class:`SloOdbs`."""

    def __init__(self, options: SloOdbsOptions | None = None) -> None:
        super().__init__(options, mode="slo_odbs")
        self.name = "fifo_cm"

    def sort_key(self, req, now: float) -> tuple[float, float, str]:
        return (req.arrival_s, req.arrival_s, req.request_id)

    def join_cost(self, slo_q: float, len_q: float, l_cm: float, o_cm: float, n: int) -> float:
        return 0.0  # no SLO or length term: only the CM size closes a batch
