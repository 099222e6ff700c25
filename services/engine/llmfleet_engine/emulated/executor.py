"""The emulated engine backend: the native executor's whole request path on a catalog GPU that exists
only as a cost model.

Everything but the forward pass is the native :class:`~llmfleet_engine.executor.Executor`: the real
:class:`~llmfleet.engine_core.EngineCore` with the configured local policy, a real
:class:`~llmfleet.kvblocks.BlockAllocator`, streaming, cancellation, drains, load snapshots and the
``vllm:*`` metrics, live KV migration's pause/land protocol. What differs:

* **Memory** is sized as the simulator sizes it: a budget of ``tp × mem_bytes ×
  mem_fraction`` of the catalog GPU, each model reserving its weights plus the peak-activation estimate
  of ``llmfleet.costmodel.memory``; merged blocks of ``block_tokens`` tokens of the largest declared
  model. No tensors are allocated.
* **A step** is priced by the simulator's cost model (``CostBook``, ``--cost-source``, default
  ``costmodel.sources.DEFAULT_COST_SOURCE``) as ``iteration(prefill tokens, Σ prefill², decodes,
  context)`` and ends that long after its start on the modelled clock, as in the simulator
  (:class:`~llmfleet_engine.emulated.pacing.StepPacer`): a step whose work was waiting when the
  previous step ended starts at the previous step's due time, not when the host got round to
  scheduling it; a step of work that arrived at an idle engine starts at its arrival, or now; when
  work was there but none could run (paused KV holders, a full pool), the clock restarts at the next
  step; a start is never more than ``max_catchup_s`` in the past (beyond it the clock slips). So the
  host's Python time between steps (completing one step, scheduling the next, other engines' threads)
  overlaps the modelled step instead of adding to it, and it is reported per step
  (``llmfleet_emulated_host_*``, ``llmfleet_emulated_slip*``). Token ids are deterministic per
  (request, position) and never EOS: a request ends at its ``max_tokens`` (a trace's output length).
* **Loading** a model takes ``weights / (tp × host-to-device bandwidth)``, as the simulator charges;
  its memory is claimed first.
* **LoRA adapters** (``max_loras``): the native adapter registry over a pool of slots without weights
  (the simulator's ``AdapterSlots`` rule), adapter loads and each step's adapter rows priced by
  ``costmodel.lora`` as in the simulator, the pool's memory reserved with the base
  (:mod:`.adapters`).
* **KV export/import** sends the block table and token range, not K/V bytes, and takes
  ``kv_bytes / link bandwidth``; a link probe received here takes ``bytes / link bandwidth``.
* **Profile sweeps** return the cost model's own times.
"""

from __future__ import annotations

import zlib
from typing import Any

from llmfleet.costmodel import LinearCost
from llmfleet.engine_core import StepPlan
from llmfleet.metrics.engine import EngineMetrics

from llmfleet_engine import profiling
from llmfleet_engine.emulated.adapters import emulated_adapter
from llmfleet_engine.emulated.clock import LagCollector, WallClock
from llmfleet_engine.emulated.config import BACKEND, EmulatedConfig
from llmfleet_engine.emulated.migration import EmulatedMigration
from llmfleet_engine.emulated.model_host import EmulatedHost, StepPricer
from llmfleet_engine.emulated.pacing import StepPacer
from llmfleet_engine.emulated.storage import NoKvStorage
from llmfleet_engine.emulated.tokenizer import WORD_BASE
from llmfleet_engine.executor import Executor
from llmfleet_engine.live_request import LiveRequest
from llmfleet_engine.lora.hosting import AdapterHost
from llmfleet_engine.profiling import ProfileResult

__all__ = ["EmulatedConfig", "EmulatedExecutor", "StepPricer", "token_id"]


def token_id(seed: int, position: int, vocab: int) -> int:
    """The deterministic ``position``-th output token of a request (never a special id)."""
    return WORD_BASE + (seed + position * 7919) % (vocab - WORD_BASE)


class EmulatedExecutor(Executor):
    """A native executor whose device is a catalog GPU priced by the simulator's cost model."""

    config: EmulatedConfig

    def __init__(self, config: EmulatedConfig | None = None, clock: WallClock | None = None) -> None:
        config = config or EmulatedConfig()
        self.clock = clock or WallClock()  # before the parts are built (they pace on it)
        self._pacer = StepPacer(self.clock.lag, config.max_catchup_s)
        super().__init__(config)
        self.backend = BACKEND

    def _new_host(self) -> EmulatedHost:
        return EmulatedHost(self.config, self.table, self.core, self.pool, self._finish_locked, self.clock)

    def _new_adapters(self) -> AdapterHost:
        """The native adapter registry, reading no files (``emulated.adapters``)."""
        return AdapterHost(self.table, self.host, emulated_adapter)

    def _new_migration(self) -> EmulatedMigration:
        return EmulatedMigration(
            self.table,
            self.core,
            self.pool,
            self.host,
            self._finish_locked,
            self._new_state,
            self.clock,
            self.config.link_bw,
            adapters=self.adapters,
        )

    # ------------------------------------------------------------------------ device and memory
    def _device_memory(self) -> tuple[str, int, int]:
        cfg = self.config
        total = cfg.tp * cfg.hw.mem_bytes
        return BACKEND, total, cfg.memory_budget_bytes or int(total * cfg.mem_fraction)

    def _kv_storage(self) -> Any:
        return NoKvStorage()

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """The native ``vllm:*`` metrics plus this engine's lag behind the cost model's times."""
        super().attach_metrics(metrics)
        metrics.registry.register(LagCollector(self.clock.lag))

    @property
    def modelled_due_s(self) -> float | None:
        """When the previous step ends on the modelled clock; None when the next step restarts it."""
        return self._pacer.due

    # ---------------------------------------------------------------------------------- steps
    def _step_inputs(self, plan: StepPlan, now: float) -> float:
        for r in plan.prefills:
            state: LiveRequest = r.payload
            if state.scheduled_s is None:
                state.scheduled_s = now
        return self._start(plan, now)

    def _schedule_locked(self, now: float) -> tuple[StepPlan, Any] | None:
        step = super()._schedule_locked(now)
        if step is None:
            self._pacer.restart()  # work was there but none could run: the modelled clock restarts
        return step

    def _start(self, plan: StepPlan, now: float) -> float:
        """The step's start on the modelled clock (``StepPacer.start``)."""
        return self._pacer.start(now, min(r.sched.arrival_s for r in plan.members))

    def _forward(self, plan: StepPlan, members: list[LiveRequest], start: float) -> tuple[list[int], float]:
        duration = members[0].model.runner.step_s(plan)
        self.clock.sleep_until(self._pacer.begin(start, duration))
        vocab = members[0].model.loaded.vocab_size
        picked = [token_id(zlib.crc32(r.request_id.encode()), len(r.tokens), vocab) for r in members]
        return picked, duration

    def _run(self, plan: StepPlan, steps: Any) -> None:
        super()._run(plan, steps)
        with self._cond:  # whether the next step's work was already waiting when this one ended
            self._pacer.ended(self.clock.monotonic(), busy=self.core.has_work())

    # ------------------------------------------------------------------------------ profiling
    def profile(self, model: str, **sweep: Any) -> ProfileResult:
        """The native sweep (``profiling.profile``: same checks, points and skips), each point timed by
        the cost model instead of a forward."""
        return profiling.profile(self, model, point=self._priced_point(model), **sweep)

    def _priced_point(self, model: str) -> profiling.PointTimer:
        lm: LinearCost = self.host.runner(model).cost

        def point(phase: str, b: int, n: int, repeats: int) -> list[float]:
            seqs = [f"{profiling.PREFIX}{phase}/{b}/{n}/{i}" for i in range(b)]

            def fits(alloc) -> None:  # OutOfBlocks (the point is skipped) as natively
                try:
                    for s in seqs:
                        alloc.allocate(s, model, n + repeats + 1)
                finally:
                    for s in seqs:
                        if s in alloc:
                            alloc.free(s)

            self.with_pool(fits)
            if phase == "prefill":
                return [lm.iteration(b * n, b * n * n, 0, 0)] * repeats
            return [lm.iteration(0, 0, b, b * (n + r + 1)) for r in range(repeats)]

        return point
