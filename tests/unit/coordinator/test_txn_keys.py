"""Transactions in etcd: the values round-trip, bad values are reported and never crash a load."""

from __future__ import annotations

import json

import pytest

from coordinator import keys as metadata_keys
from coordinator.groups.model import OffsetRecord
from coordinator.transactions import keys
from coordinator.transactions.model import TxnMetadata, TxnState
from services.etcd.values import KeyValue
from services.topic_partition import TopicPartition as TP


def sample() -> TxnMetadata:
    return TxnMetadata(
        "tx-1",
        producer_id=42,
        producer_epoch=3,
        timeout_ms=60_000,
        state=TxnState.PREPARE_COMMIT,
        last_producer_id=41,
        last_producer_epoch=32_766,
        partitions=frozenset({TP("a", 0), TP("a", 2), TP("b.c", 1)}),
        groups=frozenset({"g1", "g2"}),
        pending_offsets={"g1": {TP("a", 0): OffsetRecord(10, "m", 123, 4), TP("x", 7): OffsetRecord(0)}},
        start_ms=1_000,
        last_update_ms=2_000,
    )


def kv(key: str, value: bytes, mod: int = 5) -> KeyValue:
    return KeyValue(key, value, 1, mod, 1)


def test_metadata_round_trips():
    meta = sample()
    assert keys.decode_txn("tx-1", keys.encode_txn(meta)) == meta
    value = json.loads(keys.encode_txn(meta))
    assert value["state"] == "PREPARE_COMMIT" and value["partitions"] == {"a": [0, 2], "b.c": [1]}


_BASE = '"producer_id": 1, "producer_epoch": 0, "timeout_ms": 1'


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        ('{"state": "NOPE", ' + _BASE + "}").encode(),
        (b'{"state": "EMPTY", "producer_id": "1", "producer_epoch": 0, "timeout_ms": 1}'),
        ('{"state": "EMPTY", ' + _BASE + ', "groups": "g"}').encode(),
        ('{"state": "EMPTY", ' + _BASE + ', "partitions": {"a": [1.5]}}').encode(),
        ('{"state": "EMPTY", ' + _BASE + ', "offsets": {"g": [1]}}').encode(),
    ],
)
def test_bad_values_are_reported_and_loaded_as_new_ids(raw):
    loaded, problems = keys.load_transactions(
        [kv("transactions/bad", raw, mod=9), kv("transactions/good", keys.encode_txn(sample()), mod=11)]
    )
    assert loaded["bad"] == (None, 9)  # kept with its revision, so the next init may overwrite it
    assert loaded["good"][0].producer_id == 42 and loaded["good"][1] == 11
    assert len(problems) == 1 and problems[0].startswith("transactions/bad")


def test_other_keys_are_not_transactions_and_the_metadata_cache_ignores_ours():
    loaded, problems = keys.load_transactions([kv("transactions/", b"{}"), kv("transactions/a/b", b"{}")])
    assert loaded == {} and problems == []
    assert metadata_keys.parse_key(keys.transaction_key("t")).kind == "other"
    assert metadata_keys.parse_key(keys.PRODUCER_IDS).kind == "other"


def test_producer_id_counter_values():
    assert keys.decode_next_producer_id(keys.encode_next_producer_id(12_345)) == 12_345
    for raw in (b"", b"-1", b"abc", b"\xff"):
        with pytest.raises(keys.BadTxnValueError):
            keys.decode_next_producer_id(raw)
