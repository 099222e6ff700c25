"""Latency and memory cost models: Aladdin and SCLS forms, tensor parallelism, fitting from engine
profiles, model/hardware catalogs, roofline defaults, measured GPU operator costs (``vidur``) and the
compiled per-iteration latency the simulator and the services price with (``iteration_costs``).
Pure: no I/O beyond the explicit JSON helpers in ``serialize`` and the package's own tables that
``vidur`` reads (``data/``), no clock reads inside the models.
"""

from llmfleet.costmodel.aladdin import (
    AladdinModel,
    DecodeModel,
    KvModel,
    PrefillModel,
    TpModel,
    fit_decode,
    fit_kv,
    fit_prefill,
    fit_tp,
)
from llmfleet.costmodel.fit import FitError, FitReport, fit_curve, fit_linear
from llmfleet.costmodel.hardware import HARDWARE_CATALOG, Hardware, UnknownHardware, hardware, local_cpu
from llmfleet.costmodel.iteration_costs import (
    CostBook,
    LinearCost,
    calibrated_cost,
    cost_of,
    fitted_cost,
    roofline_cost,
    vidur_cost,
)
from llmfleet.costmodel.latency_model import (
    CostLatencyModel,
    cost_record,
    decode_iteration_time,
    latency_model,
)
from llmfleet.costmodel.models import MODEL_CATALOG, ModelArch, UnknownModel, arch_from_hf_config, model_arch
from llmfleet.costmodel.profile_fit import EngineProfileFit, fit_engine_profile
from llmfleet.costmodel.roofline import (
    RooflineDecode,
    RooflineModel,
    RooflinePrefill,
    allreduce_time,
    decode_time,
    prefill_time,
)
from llmfleet.costmodel.scls import (
    SclsDecode,
    SclsModel,
    SclsPrefill,
    fit_scls_decode,
    fit_scls_prefill,
    n_max,
)
from llmfleet.costmodel.serialize import (
    AladdinCoefficients,
    ProfileRecord,
    SclsCoefficients,
    load_record,
    record_from_fit,
    roofline_record,
    save_record,
)
from llmfleet.costmodel.sources import COST_SOURCES, DEFAULT_COST_SOURCE, check_cost_source
from llmfleet.costmodel.vidur import (
    FRAMEWORK_OVERHEAD_S,
    Hinge,
    VidurDataError,
    VidurLegs,
    fit_hinge,
    vidur_legs,
)

__all__ = [
    "COST_SOURCES",
    "DEFAULT_COST_SOURCE",
    "FRAMEWORK_OVERHEAD_S",
    "HARDWARE_CATALOG",
    "MODEL_CATALOG",
    "AladdinCoefficients",
    "AladdinModel",
    "CostBook",
    "CostLatencyModel",
    "DecodeModel",
    "EngineProfileFit",
    "FitError",
    "FitReport",
    "Hardware",
    "Hinge",
    "KvModel",
    "LinearCost",
    "ModelArch",
    "PrefillModel",
    "ProfileRecord",
    "RooflineDecode",
    "RooflineModel",
    "RooflinePrefill",
    "SclsCoefficients",
    "SclsDecode",
    "SclsModel",
    "SclsPrefill",
    "TpModel",
    "UnknownHardware",
    "UnknownModel",
    "VidurDataError",
    "VidurLegs",
    "allreduce_time",
    "arch_from_hf_config",
    "calibrated_cost",
    "check_cost_source",
    "cost_of",
    "cost_record",
    "decode_iteration_time",
    "decode_time",
    "fit_curve",
    "fit_decode",
    "fit_engine_profile",
    "fit_hinge",
    "fit_kv",
    "fit_linear",
    "fit_prefill",
    "fit_scls_decode",
    "fit_scls_prefill",
    "fit_tp",
    "fitted_cost",
    "hardware",
    "latency_model",
    "load_record",
    "local_cpu",
    "model_arch",
    "n_max",
    "prefill_time",
    "record_from_fit",
    "roofline_cost",
    "roofline_record",
    "save_record",
    "vidur_cost",
    "vidur_legs",
]
