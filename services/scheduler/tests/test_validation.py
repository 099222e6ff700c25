import pytest
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet_scheduler.validation import InvalidField, validate_submit


def req(**sampling):
    return scheduler_pb2.SubmitRequest(
        service="chat", prompt="hi", sampling=common_pb2.SamplingParams(**sampling)
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (scheduler_pb2.SubmitRequest(service="chat", prompt=""), "prompt"),
        (scheduler_pb2.SubmitRequest(service="", prompt="x"), "service"),
        (req(max_tokens=0), "sampling.max_tokens"),
        (req(max_tokens=-5), "sampling.max_tokens"),
        (req(temperature=-0.1), "sampling.temperature"),
        (req(temperature=float("nan")), "sampling.temperature"),
        (req(top_p=0.0), "sampling.top_p"),
        (req(top_p=1.5), "sampling.top_p"),
        (req(stop=[""]), "sampling.stop"),
        (scheduler_pb2.SubmitRequest(service="chat", prompt="x", request_id="r" * 129), "request_id"),
        (scheduler_pb2.SubmitRequest(service="chat", prompt="x", session="c" * 129), "session"),
    ],
)
def test_bad_fields_are_named(request_, field):
    with pytest.raises(InvalidField) as e:
        validate_submit(request_)
    assert e.value.field == field and field in str(e.value)


def test_valid_request_passes():
    validate_submit(req(max_tokens=5, temperature=0.7, top_p=1.0, seed=3, stop=["\n"]))
    validate_submit(scheduler_pb2.SubmitRequest(service="chat", prompt="hi"))  # all defaults
