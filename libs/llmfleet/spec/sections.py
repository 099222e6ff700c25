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
from llmfleet.policies import batching as batching_policies
from llmfleet.policies import capacity as capacity_policies
from llmfleet.policies import dispatch as dispatch_policies
from llmfleet.policies import engine_policy as engine_policies
from llmfleet.policies import migration as migration_policies
from llmfleet.policies import placement as placement_policies
from llmfleet.policies import registry as policy_registry
from llmfleet.policies.request import preemption as preemption_rule

_SECTION = ConfigDict(extra="forbid", frozen=True)


class _Choice(BaseModel):
    """A policy by name and its constructor options."""

    model_config = _SECTION

    policy: str
    options: dict[str, Any] = Field(default_factory=dict, description="the policy's constructor options")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"policy": data} if isinstance(data, str) else data


class EnginePolicySpec(_Choice):
    """The engine-local policy: a request policy (continuous batching) or a static batcher (static
    mode; option ``slice_end: keep|recompute``), built by
    :func:`llmfleet.policies.engine_policy.make_engine_policy`."""

    policy: str = Field(
        defaults.ENGINE_POLICY,
        description="the engine-local policy: a request policy (continuous batching) or a static batcher "
        "(static mode)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description='the policy\'s constructor options, e.g. {"batch_size": 8, "max_iterations": 64}; a '
        "static batcher's slice_end: keep (its unfinished requests' KV across slices) or recompute (drop "
        f"it and re-prefill prompt + output when re-batched, SCLS's mode), default {defaults.SLICE_END}",
    )

    @model_validator(mode="after")
    def _build(self) -> EnginePolicySpec:
        if self.policy not in engine_policies.ENGINE_POLICIES:
            raise ValueError(
                f"unknown engine policy {self.policy!r}; valid: {list(engine_policies.ENGINE_POLICIES)}"
            )
        engine_policies.make_engine_policy(self.policy, **self.options)  # a bad option is named here
        return self

    @property
    def static(self) -> bool:
        """A static batcher (the engine core's static mode)."""
        return self.policy in batching_policies.POLICIES


class DispatchSpec(_Choice):
    """Which engine gets a request (:mod:`llmfleet.policies.dispatch`), or a central mode (``scls_central``:
    the scheduler batches slices for every engine). A policy that prices requests (``reads_costs``:
    Aladdin) gets its latency models and SLOs where it runs (the scheduler's cost model and services),
    so unless the options give them its options record is checked without building the policy."""

    policy: str = Field(
        defaults.DISPATCH_POLICY,
        description="the dispatch policy: which engine gets a request (llmfleet.policies.dispatch), or "
        "scls_central (the scheduler batches slices for every engine)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description='the policy\'s constructor options, e.g. {"seed": 7} for power_of_two (a service '
        "naming its own dispatch policy takes its own options)",
    )

    @model_validator(mode="after")
    def _build(self) -> DispatchSpec:
        if self.policy in dispatch_policies.SCHEDULER_MODES:
            return self
        if self.policy not in dispatch_policies.POLICIES:
            raise ValueError(
                f"unknown dispatch policy {self.policy!r}; valid: {sorted([*dispatch_policies.POLICIES, *dispatch_policies.SCHEDULER_MODES])}"
            )
        if dispatch_policies.dispatch_needs(self.policy).reads_costs and not {
            "latency_models",
            "slos",
        } <= set(self.options):
            policy_registry.check_options("dispatch", dispatch_policies.POLICIES, self.policy, self.options)
            return self
        dispatch_policies.make_dispatch_policy(self.policy, **self.options)  # a bad option is named here
        return self

    @property
    def central(self) -> bool:
        return self.policy in dispatch_policies.SCHEDULER_MODES


class PlacementSpec(_Choice):
    """The placement planner (:mod:`llmfleet.policies.placement`) and its loop: every ``interval_s``
    over the last ``window_s`` of traffic (None: the interval), a changed plan applied once proposed
    ``confirm_intervals`` times in a row; ``adaptive_interval``: SeaLLM's Eq. 8 adapts the interval.
    ``interval_s`` None: the simulator places once (the live leader runs every
    ``defaults.LIVE_PLACEMENT_INTERVAL_S``)."""

    policy: str = Field(
        defaults.SIM_PLACEMENT_POLICY, description="the placement planner (llmfleet.policies.placement)"
    )
    interval_s: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="re-plan every this many seconds (unset: plan once)"
    )
    window_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="seconds of recent traffic each plan reads (unset: the interval)",
    )
    confirm_intervals: int = Field(
        defaults.SIM_PLACEMENT_CONFIRM_INTERVALS,
        ge=1,
        description="hysteresis: a changed plan is applied once the planner has proposed it this many "
        "intervals in a row (1: at once); a plan that serves an unserved model, or the first plan, is "
        "applied at once",
    )
    adaptive_interval: bool = Field(
        False, description="SeaLLM's Eq. 8 adapts the interval (from interval_s on)"
    )

    @model_validator(mode="after")
    def _build(self) -> PlacementSpec:
        if self.policy == defaults.PLACEMENT_POLICY:  # live only: copy the engines: lists
            if self.options:
                raise ValueError("the static placement policy takes no options")
            return self

        if self.policy not in placement_policies.POLICIES:
            raise ValueError(
                f"unknown placement policy {self.policy!r}; valid: {sorted(placement_policies.POLICIES)}"
            )
        placement_policies.make_placement_policy(self.policy, **self.options)  # a bad option is named here
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

    policy: str = Field(
        defaults.MIGRATION_POLICY,
        description="the request-migration policy: none, mell (KV packing), llumnix_lb",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description='the policy\'s constructor options, e.g. {"batching": false} for mell',
    )
    epoch_s: float = Field(
        defaults.MIGRATION_EPOCH_S, gt=0, allow_inf_nan=False, description="seconds between migration epochs"
    )
    transfer: str = Field(
        defaults.TRANSFER,
        description="how moves travel: hybrid (Mell's: each move by KV transfer or by re-prefill, "
        "within the link's and the destination's budgets), kv (KV transfer only), tokens (re-prefill only)",
    )

    @model_validator(mode="after")
    def _build(self) -> MigrationSpec:
        migration_policies.make_migration_policy(
            self.policy, **self.options
        )  # a bad name or option is named here
        migration_policies.make_transfer_planner(self.transfer)
        return self

    @property
    def runs(self) -> bool:
        return self.policy != defaults.MIGRATION_POLICY


class PreemptionSpec(BaseModel):
    """Which running request a waiting one may preempt by recompute, in every engine core and in the
    schedulers' late binding alike (:class:`~llmfleet.policies.request.preemption.PreemptionRule`):
    ``priority`` (a higher priority preempts a lower one), ``fairness`` (an API key below its fair
    share of an engine's slots plus its credit preempts the key furthest above its own; only with the
    section's ``fairness: vtc``), how often one request may be preempted, and the credit's window."""

    model_config = _SECTION

    priority: bool = Field(True, description="a waiting request preempts a running one of a lower priority")
    fairness: bool = Field(
        True,
        description="with fairness: vtc, a key below its fair share of an engine's slots plus its credit "
        "preempts the key furthest above its own",
    )
    max_preemptions: int = Field(
        preemption_rule.DEFAULT_MAX_PREEMPTIONS,
        ge=0,
        description="a request preempted this often (any preemption, KV shortage included) is no longer a "
        "victim: it runs to its end",
    )
    credit_window_s: float = Field(
        preemption_rule.DEFAULT_CREDIT_WINDOW_S,
        ge=0,
        allow_inf_nan=False,
        description="fairness credit: a key is active on an engine while it asked for a slot there within "
        "this window, and its bank of unused slot-seconds leaks with it as time constant (0: no credit, "
        "instantaneous shares)",
    )

    def rule(self) -> preemption_rule.PreemptionRule | None:
        """The rule these settings give (None: no preemption but for a KV shortage)."""
        if not (self.priority or self.fairness):
            return None
        return preemption_rule.PreemptionRule(
            self.priority, self.fairness, self.max_preemptions, self.credit_window_s
        )

    def resolved(self, fairness: defaults.Fairness) -> PreemptionSpec:
        """This section with ``fairness`` on only where the hold queue's ``fairness`` keeps it: what
        ``llmfleet up`` passes the engines, which have no hold queue."""
        return self.model_copy(update={"fairness": self.fairness and fairness == "vtc"})


class CapacitySpec(BaseModel):
    """How requests wait for capacity. ``binding``: late = a request waits in the scheduler while every
    engine hosting its model is saturated (its queue past its batch + ``queue_slack``, or its KV past
    ``kv_room_fraction``), early = bound on arrival; ``move_queued``: move not-started requests off
    engines past their room each epoch; ``cold_start``: hold requests for a model no engine hosts
    while placement loads it; ``fairness``: the order of held requests within a priority."""

    model_config = _SECTION

    binding: defaults.Binding = Field(
        defaults.BINDING,
        description="late: hold a request in the scheduler while every engine hosting its model is "
        "saturated (its queue past its batch + queue_slack, or its KV past kv_room_fraction) and dispatch "
        "it when one has room; early: bind every request to an engine on arrival (the queue stays there)",
    )
    queue_slack: int = Field(
        defaults.QUEUE_SLACK, ge=0, description="late binding: requests an engine may queue beyond its batch"
    )
    kv_room_fraction: float = Field(
        defaults.KV_ROOM_FRACTION,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="late binding: an engine whose KV (used + queued prompts) is past this share has no room",
    )
    move_queued: bool = Field(
        False,
        description="each epoch, move requests that have not started off engines past their room (batch + "
        "queue_slack) onto engines of the same model with room, for any dispatch policy (the alternative "
        "to late binding)",
    )
    cold_start: bool = Field(
        True,
        description="hold a request for a model no engine hosts until placement loads it (the service's "
        "cold_start_timeout_s); off: fail it at once (UNAVAILABLE)",
    )
    fairness: defaults.Fairness = Field(
        defaults.FAIRNESS,
        description="the order of held requests within a priority: vtc = fair among API keys by tokens "
        "served (virtual token counter), none = arrival order",
    )

    preemption: PreemptionSpec = Field(
        default_factory=PreemptionSpec,
        description="which running request a waiting one may preempt, in the engines and in late binding",
    )

    def saturation(self) -> capacity_policies.Saturation:
        return capacity_policies.Saturation(queue_slack=self.queue_slack, kv_fraction=self.kv_room_fraction)

    def preemption_rule(self) -> preemption_rule.PreemptionRule | None:
        """The engines' and late binding's preemption rule under this section's ``fairness``."""
        return self.preemption.resolved(self.fairness).rule()


class FleetPolicies(BaseModel):
    """Every policy of a fleet with its options: what ``llmfleet up`` passes to the services and what
    ``llmfleet sim --cluster-config`` runs."""

    model_config = _SECTION

    engine: EnginePolicySpec = Field(default_factory=EnginePolicySpec)
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    capacity: CapacitySpec = Field(default_factory=CapacitySpec)
