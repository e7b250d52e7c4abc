"""The one OffsetSpec <-> Kafka-style lookup timestamp mapping (storage node, gateway, coordinator)."""

import grpc
import pytest

from services import errors
from services.offset_spec import EARLIEST, LATEST
from services.proto import pb
from services.serde import offset_spec_from_proto, offset_spec_to_proto


@pytest.mark.parametrize(
    ("timestamp", "spec"),
    [
        pytest.param(EARLIEST, pb.OffsetSpec(earliest=True), id="earliest"),
        pytest.param(LATEST, pb.OffsetSpec(latest=True), id="latest"),
        pytest.param(0, pb.OffsetSpec(timestamp=0), id="epoch"),
        pytest.param(1_700_000_000_000, pb.OffsetSpec(timestamp=1_700_000_000_000), id="ms"),
    ],
)
def test_round_trip(timestamp, spec):
    assert offset_spec_to_proto(timestamp) == spec
    assert offset_spec_from_proto(spec) == timestamp


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(pb.OffsetSpec(timestamp=-5), "timestamp -5 is negative", id="negative"),
        pytest.param(pb.OffsetSpec(timestamp=-2), "timestamp -2 is negative", id="sentinel-as-timestamp"),
        pytest.param(pb.OffsetSpec(), "must set earliest, latest or timestamp", id="unset"),
    ],
)
def test_bad_spec_is_invalid_request(spec, message):
    with pytest.raises(errors.InvalidRequestError, match=message) as info:
        offset_spec_from_proto(spec)
    assert info.value.reason == "INVALID_REQUEST"
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT
    assert not info.value.retriable
