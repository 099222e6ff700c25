from llmfleet.policies.migration.base import EpochPlan, GpuState, MigrationPolicy, RequestState
from llmfleet.policies.migration.none import NoMigration


def test_no_migration_plans_nothing():
    policy = NoMigration()
    assert isinstance(policy, MigrationPolicy)
    loaded = GpuState("g0", ("llama",), 100, (RequestState("a", "llama", 95),))
    empty = GpuState("g1", ("llama",), 100)
    idle = GpuState("g2", ("llama",), 100, active=False)
    for now in (0.0, 1.0):
        assert policy.epoch([loaded, empty, idle], now) == EpochPlan()
    assert policy.epoch([], 2.0) == EpochPlan()
