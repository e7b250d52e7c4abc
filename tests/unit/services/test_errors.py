import grpc
import pytest

from services import errors


def test_every_reason_is_unique_and_looked_up():
    # Services may subclass an error to carry more detail (e.g. where the controller moved);
    # the taxonomy itself is what services/errors.py defines.
    classes = [c for c in errors._all_error_classes() if c.__module__ == errors.__name__]
    reasons = [c.reason for c in classes if c is not errors.TributaryError]
    assert len(reasons) == len(set(reasons))
    for cls in classes:
        assert errors.for_reason(cls.reason) is cls
        assert errors.for_kafka_code(cls.kafka_code) is cls


def test_unknown_reason_maps_to_root():
    assert errors.for_reason("NO_SUCH_REASON") is errors.TributaryError
    assert errors.for_kafka_code(9999) is errors.TributaryError


def test_kafka_codes_match_kafka_tables():
    assert errors.OffsetOutOfRangeError.kafka_code == 1
    assert errors.CorruptRecordError.kafka_code == 2
    assert errors.UnknownTopicOrPartitionError.kafka_code == 3
    assert errors.NotLeaderOrFollowerError.kafka_code == 6
    assert errors.IllegalGenerationError.kafka_code == 22
    assert errors.TopicAlreadyExistsError.kafka_code == 36


def test_str_carries_reason_and_message():
    err = errors.RecordTooLargeError("batch of 2000000 bytes exceeds max.message.bytes 1048588")
    assert str(err) == "[RECORD_TOO_LARGE] batch of 2000000 bytes exceeds max.message.bytes 1048588"
    assert err.grpc_code is grpc.StatusCode.INVALID_ARGUMENT
    assert not err.retriable


class _FakeRpcError(grpc.RpcError):
    """A failed call as the client sees it (pure data: code, details, trailers)."""

    def __init__(self, code, details, trailers=()):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


@pytest.mark.parametrize(
    "cls", [errors.NotLeaderOrFollowerError, errors.OffsetOutOfRangeError, errors.CorruptRecordError]
)
def test_status_round_trip_keeps_type_message_and_cause(cls):
    status = errors.to_status(cls("partition t-0 moved"))
    assert status.code is cls.grpc_code
    rpc_error = _FakeRpcError(status.code, status.details, status.trailing_metadata)
    back = errors.error_from_rpc(rpc_error)
    assert type(back) is cls
    assert back.message == "partition t-0 moved"
    assert back.__cause__ is rpc_error
    assert back.retriable == cls.retriable


def test_status_without_details_maps_by_grpc_code():
    back = errors.error_from_rpc(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert isinstance(back, errors.NetworkError)
    assert back.retriable
    assert "connection refused" in back.message
    back = errors.error_from_rpc(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"))
    assert isinstance(back, errors.RequestTimedOutError)


def test_call_cancelled_by_the_server_is_a_retriable_network_error():
    # A stopping storage node cancels the appends still in flight after its grace period: the
    # gateway and the SDK must retry them (issue 18: "TributaryError('CANCELLED: CANCELLED')").
    back = errors.error_from_rpc(_FakeRpcError(grpc.StatusCode.CANCELLED, "CANCELLED"))
    assert isinstance(back, errors.NetworkError)
    assert back.retriable
    assert back.invalid_metadata  # the route is refreshed: leadership may have moved meanwhile
