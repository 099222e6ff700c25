"""Output-length predictors behind one interface (``predict`` / ``observe``)."""

from llmfleet.predict.base import LengthPredictor, LengthQuery, Prediction
from llmfleet.predict.service_mean import ServiceMeanPredictor

__all__ = ["LengthPredictor", "LengthQuery", "Prediction", "ServiceMeanPredictor"]
