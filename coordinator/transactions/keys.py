"""Transactions in etcd: key layout and values. Pure.

Keys are relative to the cluster prefix ``/tributary/<cluster>/``:

============================  =====================================================  ===========
key                           value                                                  lifetime
============================  =====================================================  ===========
``producer_ids``              the next producer id no block has taken (decimal)      persistent
``transactions/<id>``         JSON: producer_id, producer_epoch, last_producer_id,   until the id
                              last_producer_epoch, state, timeout_ms, partitions     expires
                              ({topic: [p, ...]}), groups, offsets (staged, per
                              group: [{topic, partition, offset, metadata,
                              commit_timestamp, generation}]), start_ms,
                              last_update_ms
============================  =====================================================  ===========

Only the active controller writes them, each write fenced by its controller epoch and a
compare-and-swap on the key's mod revision (``producer_ids``: taken in blocks,
:mod:`.producer_ids`). The metadata cache ignores both (``parse_key`` calls them ``other``).
Transactional ids contain no ``/`` (validated), so keys split unambiguously.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from coordinator.groups.model import OffsetRecord
from coordinator.transactions.model import TxnMetadata, TxnState
from services.etcd.values import KeyValue
from services.topic_partition import TopicPartition

PRODUCER_IDS = "producer_ids"
TRANSACTIONS = "transactions/"

#: Largest ``transactions/<id>`` value written. etcd refuses requests over its --max-request-bytes
#: (1.5 MiB by default); the rest of a write (offset keys of a commit, compares) stays far below
#: the remainder. About 40,000 partitions, or 20,000 staged offsets without metadata.
MAX_TXN_VALUE_BYTES = 1024 * 1024


class BadTxnValueError(ValueError):
    """A transactions key's value is not in the format this module writes."""


def transaction_key(transactional_id: str) -> str:
    return f"{TRANSACTIONS}{transactional_id}"


def transactional_id_of(key: str) -> str | None:
    """The id a ``transactions/<id>`` key names; None for any other key."""
    if not key.startswith(TRANSACTIONS):
        return None
    name = key[len(TRANSACTIONS) :]
    return name if name and "/" not in name else None


# ---- producer id counter --------------------------------------------------------------------------


def encode_next_producer_id(next_id: int) -> bytes:
    return str(next_id).encode()


def decode_next_producer_id(raw: bytes) -> int:
    try:
        value = int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise BadTxnValueError(f"{PRODUCER_IDS} is not a decimal integer: {raw[:40]!r}") from None
    if value < 0:
        raise BadTxnValueError(f"{PRODUCER_IDS} is negative: {value}")
    return value


# ---- transaction metadata ---------------------------------------------------------------------


def encode_txn(meta: TxnMetadata) -> bytes:
    """The ``transactions/<id>`` value. Linear in partitions and staged offsets."""
    partitions: dict[str, list[int]] = {}
    for tp in sorted(meta.partitions):
        partitions.setdefault(tp.topic, []).append(tp.partition)
    offsets = {
        group: [
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": record.offset,
                "metadata": record.metadata,
                "commit_timestamp": record.commit_timestamp,
                "generation": record.generation,
            }
            for tp, record in sorted(staged.items())
        ]
        for group, staged in sorted(meta.pending_offsets.items())
    }
    value = {
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "last_producer_id": meta.last_producer_id,
        "last_producer_epoch": meta.last_producer_epoch,
        "state": meta.state.value,
        "timeout_ms": meta.timeout_ms,
        "partitions": partitions,
        "groups": sorted(meta.groups),
        "offsets": offsets,
        "start_ms": meta.start_ms,
        "last_update_ms": meta.last_update_ms,
    }
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode_txn(transactional_id: str, raw: bytes) -> TxnMetadata:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadTxnValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadTxnValueError("expected a JSON object")
    try:
        state = TxnState(value.get("state"))
    except ValueError:
        raise BadTxnValueError(f"unknown transaction state {value.get('state')!r}") from None
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=_int(value, "producer_id"),
        producer_epoch=_int(value, "producer_epoch"),
        timeout_ms=_int(value, "timeout_ms"),
        state=state,
        last_producer_id=_int(value, "last_producer_id", -1),
        last_producer_epoch=_int(value, "last_producer_epoch", -1),
        partitions=_partitions(value.get("partitions", {})),
        groups=frozenset(_strings(value.get("groups", []), "groups")),
        pending_offsets=_offsets(value.get("offsets", {})),
        start_ms=_int(value, "start_ms", -1),
        last_update_ms=_int(value, "last_update_ms", -1),
    )


def load_transactions(
    kvs: Iterable[KeyValue],
) -> tuple[dict[str, tuple[TxnMetadata | None, int]], list[str]]:
    """Every transactional id under ``transactions/`` with its key's mod revision, and a
    description of each value that is not in this module's format (loaded as None: the id is
    treated as new, and its next InitProducerId overwrites the key)."""
    loaded: dict[str, tuple[TxnMetadata | None, int]] = {}
    problems: list[str] = []
    for kv in kvs:
        transactional_id = transactional_id_of(kv.key)
        if transactional_id is None:
            continue
        loaded[transactional_id] = (decoded_or_none(kv, problems), kv.mod_revision)
    return loaded, problems


def decoded_or_none(kv: KeyValue, problems: list[str]) -> TxnMetadata | None:
    """The metadata in ``kv``, or None with the problem noted."""
    transactional_id = transactional_id_of(kv.key) or ""
    try:
        return decode_txn(transactional_id, kv.value)
    except (BadTxnValueError, TypeError, ValueError) as exc:
        problems.append(f"{kv.key}: {exc}")
        return None


def _int(value: dict[str, Any], name: str, default: int | None = None) -> int:
    item = value.get(name, default)
    if isinstance(item, bool) or not isinstance(item, int):
        raise BadTxnValueError(f"field {name!r} must be an integer, got {item!r}")
    return item


def _strings(items: Any, name: str) -> list[str]:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise BadTxnValueError(f"field {name!r} must be a list of strings")
    return items


def _partitions(value: Any) -> frozenset[TopicPartition]:
    if not isinstance(value, dict):
        raise BadTxnValueError("field 'partitions' must be an object of topic -> [partition, ...]")
    tps: list[TopicPartition] = []
    for topic, partitions in value.items():
        if not isinstance(partitions, list) or any(
            isinstance(p, bool) or not isinstance(p, int) for p in partitions
        ):
            raise BadTxnValueError(f"partitions of {topic!r} must be a list of integers")
        tps.extend(TopicPartition(topic, p) for p in partitions)
    return frozenset(tps)


def _offsets(value: Any) -> dict[str, dict[TopicPartition, OffsetRecord]]:
    if not isinstance(value, dict):
        raise BadTxnValueError("field 'offsets' must be an object of group -> [offset, ...]")
    staged: dict[str, dict[TopicPartition, OffsetRecord]] = {}
    for group, entries in value.items():
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise BadTxnValueError(f"offsets of group {group!r} must be a list of objects")
        staged[group] = {
            TopicPartition(str(e.get("topic", "")), _int(e, "partition")): OffsetRecord(
                _int(e, "offset"),
                str(e.get("metadata", "")),
                _int(e, "commit_timestamp", -1),
                _int(e, "generation", -1),
            )
            for e in entries
        }
    return staged
