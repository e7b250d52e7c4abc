"""The one Acks: users' settings (SDK, Spark) and the protobuf enum of requests."""

import grpc
import pytest

from services import errors
from services.acks import Acks
from services.proto import pb
from services.serde import acks_from_proto, acks_to_proto


@pytest.mark.parametrize(
    ("setting", "acks"),
    [
        ("all", Acks.ALL),
        (-1, Acks.ALL),
        ("-1", Acks.ALL),
        (1, Acks.LEADER),
        ("1", Acks.LEADER),
        (0, Acks.NONE),
        ("0", Acks.NONE),
        (Acks.LEADER, Acks.LEADER),
    ],
)
def test_parse_settings(setting, acks):
    assert Acks.parse(setting) is acks


@pytest.mark.parametrize("setting", [2, "2", "ALL", "leader", None, [1]])
def test_parse_refuses_other_settings(setting):
    with pytest.raises(ValueError, match="acks must be 0, 1 or 'all'"):
        Acks.parse(setting)


def test_proto_round_trip_and_kafka_default():
    for acks in Acks:
        assert acks_from_proto(acks_to_proto(acks)) is acks
    assert acks_from_proto(pb.ACKS_UNSPECIFIED) is Acks.ALL  # Kafka's producer default


def test_unknown_proto_value_is_invalid_required_acks():
    with pytest.raises(errors.InvalidRequiredAcksError, match="acks value 7") as info:
        acks_from_proto(7)
    assert info.value.reason == "INVALID_REQUIRED_ACKS"
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT
