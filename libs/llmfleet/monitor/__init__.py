"""The service monitor (per-service arrival rates, lengths, latencies, SLO attainment over sliding
windows), the engine pool and the placement decision log: what the placement leader decides from.

Pure except :mod:`llmfleet.monitor.wire` (protobuf conversion), which is not imported here.
"""

from llmfleet.monitor.decisions import DECISION_LOG_SIZE, Decision, decision_log
from llmfleet.monitor.merge import merge_services, merge_windows
from llmfleet.monitor.monitor import FleetMonitor, ServiceMonitor, SourceReport, empty_stats, to_loads
from llmfleet.monitor.pool import EnginePool, PoolEngine, engine_pool, guess_hardware
from llmfleet.monitor.records import Completion, RequestSample
from llmfleet.monitor.solo import FloorSolo, SoloTime
from llmfleet.monitor.stats import Distribution, LengthStats, ServiceStats, WindowStats
from llmfleet.monitor.window import DEFAULT_WINDOWS_S, ServiceWindow

__all__ = [
    "DECISION_LOG_SIZE",
    "DEFAULT_WINDOWS_S",
    "Completion",
    "Decision",
    "Distribution",
    "EnginePool",
    "FleetMonitor",
    "FloorSolo",
    "LengthStats",
    "PoolEngine",
    "RequestSample",
    "ServiceMonitor",
    "ServiceStats",
    "ServiceWindow",
    "SoloTime",
    "SourceReport",
    "WindowStats",
    "decision_log",
    "empty_stats",
    "engine_pool",
    "guess_hardware",
    "merge_services",
    "merge_windows",
    "to_loads",
]
