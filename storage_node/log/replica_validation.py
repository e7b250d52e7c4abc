"""Validation of batches a follower copies from its leader, before anything is written. Pure.

A follower writes the leader's bytes unchanged: offsets and leader epochs are the leader's. The
leader validated every record when it accepted the batch, so a follower checks what a broken
link or a confused leader could get wrong, at header cost: structure and CRC of each batch, and
that the batches continue its log exactly -- the first at its log end, each right after the
previous, leader epochs never going back. Any failure raises CorruptRecordError and nothing of
the response is written (the fetcher asks again).
"""

from __future__ import annotations

from typing import NamedTuple

from services.errors import CorruptRecordError
from services.records import iter_batches
from services.records.batch import as_byte_view


class ReplicatedBatch(NamedTuple):
    """Where one batch sits in the fetched bytes, and what the log needs to write it."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    leader_epoch: int
    max_timestamp: int


def validate_replicated_batches(
    data, log_end_offset: int, latest_epoch: int, *, allow_gaps: bool = False
) -> list[ReplicatedBatch]:
    """Check the fetched batches against the follower's log end and latest epoch; return them.

    ``data`` holds whole batches (the fetcher drops a partial tail before calling this).
    ``allow_gaps`` (a compacted log, whose leader's cleaner removed whole batches): a batch may
    start past where the previous one ended, never before.
    """
    view = as_byte_view(data)
    batches: list[ReplicatedBatch] = []
    expected = log_end_offset
    epoch = latest_epoch
    position = 0
    for batch in iter_batches(view):
        batch.validate()
        if batch.base_offset < expected or (batch.base_offset > expected and not allow_gaps):
            raise CorruptRecordError(
                f"replicated batch at byte {position} starts at offset {batch.base_offset}, "
                f"expected {expected}"
            )
        if batch.partition_leader_epoch < epoch:
            raise CorruptRecordError(
                f"replicated batch at offset {batch.base_offset} has leader epoch "
                f"{batch.partition_leader_epoch}, below the log's latest {epoch}"
            )
        size = batch.size_in_bytes
        batches.append(
            ReplicatedBatch(
                position,
                size,
                batch.base_offset,
                batch.last_offset,
                batch.partition_leader_epoch,
                batch.max_timestamp,
            )
        )
        expected = batch.last_offset + 1
        epoch = batch.partition_leader_epoch
        position += size
    return batches
