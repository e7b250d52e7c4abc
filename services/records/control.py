"""Control records: the COMMIT and ABORT markers that end a transaction (Kafka's
``ControlRecordType`` and ``EndTransactionMarker``). Pure.

A marker is a control batch (control and transactional attribute bits set, the producer's id
and epoch, no sequence) holding one record::

    key   = version int16 (0), type int16 (0 = ABORT, 1 = COMMIT)
    value = version int16 (0), coordinator epoch int32

Only storage nodes write them (on the transaction coordinator's request); consumers never see
them as records.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from services.errors import CorruptRecordError
from services.records.builder import RecordBatchBuilder

ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class Marker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def marker_batch(
    *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp: int
) -> bytes:
    """A control batch with one COMMIT or ABORT marker (base offset 0, stamped on append)."""
    builder = RecordBatchBuilder(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        is_transactional=True,
        is_control=True,
    )
    builder.append(
        _VALUE.pack(0, coordinator_epoch),
        key=_KEY.pack(0, COMMIT if commit else ABORT),
        timestamp=timestamp,
    )
    return builder.build()


def parse_marker(key: bytes | None, value: bytes | None) -> Marker:
    """The marker a control record carries; CorruptRecordError for anything else."""
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError("control record without a type")
    _, kind = _KEY.unpack_from(key)
    if kind not in (ABORT, COMMIT):
        raise CorruptRecordError(f"control record of unknown type {kind}")
    epoch = -1
    if value is not None and len(value) >= _VALUE.size:
        _, epoch = _VALUE.unpack_from(value)
    return Marker(kind == COMMIT, epoch)
