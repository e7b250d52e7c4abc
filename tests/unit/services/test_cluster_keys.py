"""The registration record two services share (services/cluster_keys.py)."""

from __future__ import annotations

import pytest

from services.broker_address import BrokerAddress
from services.cluster_keys import broker_key, cluster_prefix, decode_broker_record, encode_broker_record


def test_round_trip_and_layout():
    record = BrokerAddress(3, "10.0.0.5", 9094, 9095, "rack-a")
    assert decode_broker_record(encode_broker_record(record)) == record
    assert decode_broker_record(encode_broker_record(record).encode()) == record
    assert broker_key(3) == "brokers/3" and cluster_prefix("prod") == "/tributary/prod/"


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"host": "h"}',
        b'{"node_id": "1"}',
        b'{"node_id": true}',
        b'{"node_id": 1, "grpc_port": 1.5}',
        b"\xff",
    ],
)
def test_bad_values_are_refused(raw):
    with pytest.raises(ValueError):
        decode_broker_record(raw)


def test_the_record_holds_the_address_only():
    """A subclass's extra fields (the coordinator's incarnation) never reach etcd."""
    from coordinator.model import RegisteredBroker

    registered = RegisteredBroker(3, "h", 1, 2, "r", incarnation=7)
    assert decode_broker_record(encode_broker_record(registered)) == BrokerAddress(3, "h", 1, 2, "r")
