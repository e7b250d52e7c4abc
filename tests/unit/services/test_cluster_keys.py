"""The registration record two services share (services/cluster_keys.py)."""

from __future__ import annotations

import pytest

from services.cluster_keys import BrokerRecord, broker_key, cluster_prefix


def test_round_trip_and_layout():
    record = BrokerRecord(3, "10.0.0.5", 9094, 9095, "rack-a")
    assert BrokerRecord.decode(record.encode()) == record
    assert BrokerRecord.decode(record.encode().encode()) == record
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
        BrokerRecord.decode(raw)
