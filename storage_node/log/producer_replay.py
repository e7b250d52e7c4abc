"""Rebuilding a partition's producer state and aborted-transaction index from its segments.

Used at load (from the newest producer-state snapshot to the log end) and after a truncation
(from the newest snapshot at or below the cut). Reads batch headers only, and the one record of
each control batch (a transaction marker), so replaying a whole segment costs a header scan.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.records import iter_batches
from services.records.control import parse_marker
from services.records.format import CONTROL_MASK, TRANSACTIONAL_MASK
from services.records.header import BatchHeader
from storage_node.log.producer_state import AbortedTransaction, BatchFacts, ProducerStateManager
from storage_node.log.segment import Segment
from storage_node.log.transaction_index import AbortedTransactions


def batch_facts(header: BatchHeader) -> BatchFacts:
    return BatchFacts(
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        # The sequence span, as Kafka's lastSequence = baseSequence + lastOffsetDelta: the record
        # count of any producer batch, but not of one the log cleaner emptied or thinned.
        header.last_offset_delta + 1,
        bool(header.attributes & TRANSACTIONAL_MASK),
        bool(header.attributes & CONTROL_MASK),
        header.max_timestamp,
    )


def marker_of(batch_bytes) -> tuple[bool, int]:
    """``(commit, coordinator epoch)`` of a control batch's marker."""
    for batch in iter_batches(batch_bytes):
        for record in batch.records():
            marker = parse_marker(record.key, record.value)
            return marker.commit, marker.coordinator_epoch
    return False, -1


def replay_segments(
    segments: Iterable[Segment],
    producers: ProducerStateManager,
    aborted: AbortedTransactions,
    from_offset: int,
) -> int:
    """Apply every batch ending at or after ``from_offset`` to ``producers`` and make the
    aborted-transaction index from ``from_offset`` on what the batches say; returns the number
    of batches applied."""
    found: list[tuple[int, AbortedTransaction]] = []
    applied = 0
    for segment in segments:
        if segment.next_offset <= from_offset:
            continue
        for position, header in segment.log.batch_headers():
            if header.last_offset < from_offset:
                continue
            facts = batch_facts(header)
            commit, coordinator_epoch = None, -1
            if facts.is_control:
                commit, coordinator_epoch = marker_of(segment.log.read(position, header.size_in_bytes))
            ended = producers.update(
                facts,
                header.base_offset,
                header.last_offset,
                marker_commit=commit,
                coordinator_epoch=coordinator_epoch,
            )
            if ended is not None:
                found.append((segment.base_offset, ended))
            applied += 1
    aborted.rebuild(from_offset, found)
    return applied
