"""Dropping the records of aborted transactions, as a read_committed consumer does. Pure.

A read_committed fetch returns the batches below the last stable offset together with the
aborted transactions that overlap them: ``(producer id, first offset)`` pairs. Walking the
batches in offset order (Kafka's consumer rule): when the walk reaches an aborted transaction's
first offset, that producer's transactional batches are dropped until its ABORT marker; control
batches (markers) are never records for the application.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from services.records.batch import RecordBatchView
from services.records.control import parse_marker


class AbortedTransactionFilter:
    """Says, batch by batch in offset order, whether a read_committed consumer drops it."""

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self._pending = [(first_offset, producer_id) for producer_id, first_offset in aborted]
        heapq.heapify(self._pending)
        self._aborting: set[int] = set()

    def drops(self, batch: RecordBatchView) -> bool:
        """True for a control batch, or a batch of a transaction that was aborted."""
        pending = self._pending
        while pending and pending[0][0] <= batch.last_offset:
            self._aborting.add(heapq.heappop(pending)[1])
        if batch.is_control:
            if batch.producer_id in self._aborting and _is_abort(batch):
                self._aborting.discard(batch.producer_id)
            return True
        return batch.is_transactional and batch.producer_id in self._aborting


def _is_abort(batch: RecordBatchView) -> bool:
    for record in batch.records():
        return not parse_marker(record.key, record.value).commit
    return False
