"""Validation of producer payloads before anything is written (Kafka's ``LogValidator``, minus
recompression and format conversion, which Tributary never does).

Pure: works on a buffer, returns per-batch facts, raises the taxonomy's errors. The partition log
calls :func:`validate_producer_batches` on the whole payload first, so a bad batch anywhere means
not one byte of the payload reaches the disk.
"""

from __future__ import annotations

from typing import NamedTuple

from services.errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError, RecordTooLargeError
from services.records import MAGIC, BatchHeader, RecordBatchView, TimestampType, iter_batches
from services.records import record as _record
from services.records.batch import as_byte_view
from services.records.format import (
    CONTROL_MASK,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
)
from storage_node.log.producer_state import BatchFacts


class ValidatedBatch(NamedTuple):
    """Where one valid batch sits in the payload, and the header facts the log needs. (A
    NamedTuple: one is made per batch appended, three times cheaper than a frozen dataclass.)"""

    position: int
    size: int
    record_count: int
    last_offset_delta: int
    max_timestamp: int
    timestamp_type: TimestampType
    #: What the producer state checks (producer id -1: a plain batch).
    facts: BatchFacts


def validate_producer_batches(data, *, max_message_bytes: int, segment_bytes: int) -> list[ValidatedBatch]:
    """Check every batch of a producer's payload; return them in order, or raise.

    * no bytes at all -> InvalidRecordError;
    * a truncated batch, a bad length, wrong magic, a CRC mismatch -> CorruptRecordError;
    * a batch larger than ``max.message.bytes`` or than a whole segment -> RecordTooLargeError;
    * an empty batch, a record count that disagrees with ``lastOffsetDelta`` (producer batches are
      dense), a control batch (only the broker writes those), a transactional batch without a
      producer id, an invalid producer id / epoch / sequence, or a payload mixing an idempotent
      producer's batches with other producers' -> InvalidRecordError;
    * a negative timestamp other than -1 (no timestamp), or the LogAppendTime bit (only the
      broker chooses that) -> InvalidTimestampError;
    * any record that is not well-formed -- a length, key, value or header running past its
      record, a malformed varint, an impossible header count, a header key that is not UTF-8,
      offset deltas other than 0..n-1, records that do not fill the batch or disagree with its
      count, a compressed payload that does not decompress within ``MAX_DECOMPRESSED_SIZE`` ->
      CorruptRecordError, naming the batch and the record.

    Every record is walked (``RecordBatchView.validate_records``), as Kafka's ``LogValidator``
    reads every record of a client's batch: a batch stored here must never fail a consumer.

    With the C accelerator, a payload of uncompressed batches that pass every check is answered
    by one call (``scan_producer_batches``: the same checks in one pass, no view or header
    object per batch -- a fifth of a leader's time per small batch went here); any other
    payload, and every refusal, goes through the Python checks below, which are the reference
    and say what is wrong.
    """
    # Looked up on the module at each call: the tests switch between the C and the Python code.
    scanned = _record.scan_producer_batches(data, max_message_bytes, segment_bytes)
    if scanned is not None:
        # tuple.__new__: the NamedTuples without their keyword-handling __new__ (a third of
        # the cost; two per batch were a seventh of a node's time for one-record batches).
        new = tuple.__new__
        return [
            new(
                ValidatedBatch,
                (
                    position,
                    size,
                    count,
                    delta,
                    max_ts,
                    _CREATE_TIME,
                    new(BatchFacts, (producer_id, epoch, sequence, count, transactional, False, max_ts)),
                ),
            )
            for position, size, count, delta, max_ts, producer_id, epoch, sequence, transactional in scanned
        ]
    return _validate_in_python(data, max_message_bytes, segment_bytes)


#: The timestamp type of every producer batch accepted (LogAppendTime is the broker's to set).
_CREATE_TIME = TimestampType.CREATE_TIME


def _validate_in_python(data, max_message_bytes: int, segment_bytes: int) -> list[ValidatedBatch]:
    """``validate_producer_batches`` in Python: every payload the fast path does not answer."""
    view = as_byte_view(data)
    if not len(view):
        raise InvalidRecordError("produce payload holds no record batches")
    validated: list[ValidatedBatch] = []
    position = 0
    for batch in iter_batches(view):
        _ensure_size_allowed(batch, max_message_bytes, segment_bytes)
        if batch.magic != MAGIC:
            raise CorruptRecordError(f"batch at byte {position} has magic {batch.magic}, expected {MAGIC}")
        batch.validate()
        _ensure_producer_batch(batch.header, position)
        _ensure_valid_records(batch, position)
        header = batch.header
        validated.append(
            ValidatedBatch(
                position,
                batch.size_in_bytes,
                batch.record_count,
                batch.last_offset_delta,
                batch.max_timestamp,
                batch.timestamp_type,
                BatchFacts(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.record_count,
                    bool(header.attributes & TRANSACTIONAL_MASK),
                    False,
                    header.max_timestamp,
                ),
            )
        )
        position += batch.size_in_bytes
    _ensure_one_producer(validated)
    return validated


def _ensure_one_producer(validated: list[ValidatedBatch]) -> None:
    """A payload with an idempotent or transactional batch is one producer's unit (appended and
    deduplicated whole): every batch must carry the same producer id, epoch and transactional bit."""
    if len(validated) < 2 or all(b.facts.producer_id == NO_PRODUCER_ID for b in validated):
        return
    first = validated[0].facts
    wanted = (first.producer_id, first.producer_epoch, first.is_transactional)
    for b in validated[1:]:
        if (b.facts.producer_id, b.facts.producer_epoch, b.facts.is_transactional) != wanted:
            raise InvalidRecordError(
                f"batch at byte {b.position}: the batches of a payload with an idempotent or "
                "transactional batch must all come from that one producer and epoch (the first "
                f"is producer {first.producer_id} epoch {first.producer_epoch}, this one producer "
                f"{b.facts.producer_id} epoch {b.facts.producer_epoch})"
            )


def _ensure_size_allowed(batch: RecordBatchView, max_message_bytes: int, segment_bytes: int) -> None:
    # Checked before the CRC, as Kafka does: an oversized batch is refused for its size whatever
    # its content.
    size = batch.size_in_bytes
    if size > max_message_bytes:
        raise RecordTooLargeError(
            f"batch of {size} bytes is larger than max.message.bytes ({max_message_bytes})"
        )
    if size > segment_bytes:
        raise RecordTooLargeError(f"batch of {size} bytes is larger than segment.bytes ({segment_bytes})")


def _ensure_valid_records(batch: RecordBatchView, position: int) -> None:
    # A walk of every field of every record, in C when the accelerator is built (measured in
    # bench/storage.py against the old length-prefix-only walk: see the commit that added it).
    try:
        batch.validate_records()
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"batch at byte {position}: {exc.message}") from exc


#: Attribute bits a producer must not set: the broker writes control batches and chooses
#: LogAppendTime.
_REFUSED_ATTRIBUTES = CONTROL_MASK | TIMESTAMP_TYPE_MASK


def _ensure_producer_batch(header: BatchHeader, position: int) -> None:
    """The header rules for a client's batch (Kafka's ``LogValidator.validateBatch``)."""
    attributes, last_offset_delta, base_ts, max_ts, producer_id, epoch, sequence, count = header[5:]
    # Every rule at once for the batches that pass (this runs per batch appended); the slow path
    # below finds which rule a refused batch broke.
    if (
        0 < count == last_offset_delta + 1
        and not attributes & _REFUSED_ATTRIBUTES
        and base_ts >= NO_TIMESTAMP
        and max_ts >= NO_TIMESTAMP
        and (
            (producer_id == NO_PRODUCER_ID and not attributes & TRANSACTIONAL_MASK)
            or (producer_id >= 0 and epoch >= 0 and sequence >= 0)
        )
    ):
        return
    _refuse_producer_batch(header, f"batch at byte {position}")


def _refuse_producer_batch(header: BatchHeader, where: str) -> None:
    count, last_offset_delta = header.record_count, header.last_offset_delta
    if count == 0:
        raise InvalidRecordError(f"{where} holds no records")
    if count != last_offset_delta + 1:
        raise InvalidRecordError(
            f"{where}: {count} records but last offset delta {last_offset_delta}; "
            "a producer batch must have dense offsets"
        )
    if header.attributes & CONTROL_MASK:
        raise InvalidRecordError(f"{where} is a control batch; only the broker writes those")
    _refuse_producer_state(header, where)
    if header.max_timestamp < NO_TIMESTAMP or header.base_timestamp < NO_TIMESTAMP:
        raise InvalidTimestampError(
            f"{where} has a negative timestamp (base {header.base_timestamp}, max {header.max_timestamp})"
        )
    if header.attributes & TIMESTAMP_TYPE_MASK:
        raise InvalidTimestampError(
            f"{where} is marked LogAppendTime; a producer should not set that timestamp type "
            "(the topic's message.timestamp.type decides)"
        )
    raise AssertionError(f"{where}: no producer-batch rule is broken; {header}")


def _refuse_producer_state(header: BatchHeader, where: str) -> None:
    # Kafka's rules: a transactional batch needs a producer id; a producer id needs an epoch and
    # a base sequence; ids other than -1 are non-negative.
    producer_id, epoch, sequence = header.producer_id, header.producer_epoch, header.base_sequence
    if header.attributes & TRANSACTIONAL_MASK and producer_id == NO_PRODUCER_ID:
        raise InvalidRecordError(f"{where} is transactional and has no producer id")
    if producer_id == NO_PRODUCER_ID:
        return
    if producer_id < NO_PRODUCER_ID:
        raise InvalidRecordError(f"{where} has producer id {producer_id}; -1 means none, others are >= 0")
    if epoch < 0:
        raise InvalidRecordError(f"{where} has producer id {producer_id} with invalid producer epoch {epoch}")
    if sequence < 0 or sequence == NO_SEQUENCE:
        raise InvalidRecordError(
            f"{where} has producer id {producer_id} with invalid base sequence {sequence}"
        )
