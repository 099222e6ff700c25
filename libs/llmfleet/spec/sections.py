"""The policy sections one cluster file holds, read by the live services and the simulator alike.

Each section is a policy name plus its constructor ``options`` (one spelling everywhere), and the
settings of the loop that runs it. A section is checked by building its policy, so a misspelt name or
option is an error naming it. Live-only settings (etcd, ports, how many moves run at once) live in the
live config's subclasses (:mod:`llmfleet.config`); the simulator reads these sections only.

A section may be written as its policy name alone: ``dispatch: jsq`` is ``dispatch: {policy: jsq}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

import llmfleet.spec.defaults as defaults

_SECTION = ConfigDict(extra="forbid", frozen=True)


class _Choice(BaseModel):
    """A policy by name and its constructor options."""

    model_config = _SECTION

    policy: str
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"policy": data} if isinstance(data, str) else data


class EnginePolicySpec(_Choice):
    """The engine-local policy: a request policy (continuous batching) or a static batcher (static
    mode; option ``slice_end: keep|recompute``), built by
    :func:`llmfleet.policies.engine_policy.make_engine_policy`."""

    policy: str = defaults.ENGINE_POLICY

    @model_validator(mode="after")
    def _build(self) -> EnginePolicySpec:
        from llmfleet.policies.engine_policy import ENGINE_POLICIES, make_engine_policy

        if self.policy not in ENGINE_POLICIES:
            raise ValueError(f"unknown engine policy {self.policy!r}; valid: {list(ENGINE_POLICIES)}")
        make_engine_policy(self.policy, **self.options)  # a bad option is named here
        return self

    @property
    def static(self) -> bool:
        """A static batcher (the engine core's static mode)."""
        from llmfleet.policies.batching import POLICIES as BATCHING

        return self.policy in BATCHING


class DispatchSpec(_Choice):
    """Which engine gets a request (:mod:`llmfleet.policies.dispatch`), or a central mode (``scls_central``:
    the scheduler batches slices for every engine). A policy that prices requests (``reads_costs``:
    Aladdin) gets its latency models and SLOs where it runs (the scheduler's cost model and services),
    so unless the options give them its options record is checked without building the policy."""

    policy: str = defaults.DISPATCH_POLICY

    @model_validator(mode="after")
    def _build(self) -> DispatchSpec:
        from llmfleet.policies.dispatch import POLICIES, SCHEDULER_MODES, dispatch_needs, make_dispatch_policy
        from llmfleet.policies.registry import check_options

        if self.policy in SCHEDULER_MODES:
            return self
        if self.policy not in POLICIES:
            raise ValueError(
                f"unknown dispatch policy {self.policy!r}; valid: {sorted([*POLICIES, *SCHEDULER_MODES])}"
            )
        if dispatch_needs(self.policy).reads_costs and not {"latency_models", "slos"} <= set(self.options):
            check_options("dispatch", POLICIES, self.policy, self.options)
            return self
        make_dispatch_policy(self.policy, **self.options)  # a bad option is named here
        return self

    @property
    def central(self) -> bool:
        from llmfleet.policies.dispatch import SCHEDULER_MODES

        return self.policy in SCHEDULER_MODES


class PlacementSpec(_Choice):
    """The placement planner (:mod:`llmfleet.policies.placement`) and its loop: every ``interval_s``
    over the last ``window_s`` of traffic (None: the interval), a changed plan applied once proposed
    ``confirm_intervals`` times in a row; ``adaptive_interval``: SeaLLM's Eq. 8 adapts the interval.
    ``interval_s`` None: the simulator places once (the live leader runs every
    ``defaults.LIVE_PLACEMENT_INTERVAL_S``)."""

    policy: str = defaults.SIM_PLACEMENT_POLICY
    interval_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    window_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    confirm_intervals: int = Field(defaults.SIM_PLACEMENT_CONFIRM_INTERVALS, ge=1)
    adaptive_interval: bool = False

    @model_validator(mode="after")
    def _build(self) -> PlacementSpec:
        if self.policy == defaults.PLACEMENT_POLICY:  # live only: copy the engines: lists
            if self.options:
                raise ValueError("the static placement policy takes no options")
            return self
        from llmfleet.policies.placement import POLICIES, make_placement_policy

        if self.policy not in POLICIES:
            raise ValueError(f"unknown placement policy {self.policy!r}; valid: {sorted(POLICIES)}")
        make_placement_policy(self.policy, **self.options)  # a bad option is named here
        if self.adaptive_interval and self.interval_s is None:
            raise ValueError("adaptive_interval needs interval_s (its initial interval)")
        return self

    @property
    def planned(self) -> bool:
        """Whether a planner decides (any policy but ``static``)."""
        return self.policy != defaults.PLACEMENT_POLICY


class MigrationSpec(_Choice):
    """The request-migration policy (:mod:`llmfleet.policies.migration`: ``none``, ``mell``,
    ``llumnix_lb``) run every ``epoch_s``, its moves travelling by ``transfer`` (hybrid, kv, tokens).
    ``epoch_s`` also paces the queue moves and Aladdin's rebalancing."""

    policy: str = defaults.MIGRATION_POLICY
    epoch_s: float = Field(defaults.MIGRATION_EPOCH_S, gt=0, allow_inf_nan=False)
    transfer: str = defaults.TRANSFER

    @model_validator(mode="after")
    def _build(self) -> MigrationSpec:
        from llmfleet.policies.migration import make_migration_policy, make_transfer_planner

        make_migration_policy(self.policy, **self.options)  # a bad name or option is named here
        make_transfer_planner(self.transfer)
        return self

    @property
    def runs(self) -> bool:
        return self.policy != defaults.MIGRATION_POLICY


class CapacitySpec(BaseModel):
    """How requests wait for capacity. ``binding``: late = a request waits in the scheduler while every
    engine hosting its model is saturated (its queue past its batch + ``queue_slack``, or its KV past
    ``kv_room_fraction``), early = bound on arrival; ``move_queued``: move not-started requests off
    engines past their room each epoch; ``cold_start``: hold requests for a model no engine hosts
    while placement loads it."""

    model_config = _SECTION

    binding: defaults.Binding = defaults.BINDING
    queue_slack: int = Field(defaults.QUEUE_SLACK, ge=0)
    kv_room_fraction: float = Field(defaults.KV_ROOM_FRACTION, gt=0, le=1, allow_inf_nan=False)
    move_queued: bool = False
    cold_start: bool = True

    def saturation(self):  # -> llmfleet.policies.capacity.Saturation
        from llmfleet.policies.capacity import Saturation

        return Saturation(queue_slack=self.queue_slack, kv_fraction=self.kv_room_fraction)


class FleetPolicies(BaseModel):
    """Every policy of a fleet with its options: what ``llmfleet up`` passes to the services and what
    ``llmfleet sim --cluster-config`` runs."""

    model_config = _SECTION

    engine: EnginePolicySpec = Field(default_factory=EnginePolicySpec)
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    capacity: CapacitySpec = Field(default_factory=CapacitySpec)
