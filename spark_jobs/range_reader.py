"""Reading one offset range on an executor, through the SDK's ``Consumer``, as Arrow batches.

A task reads exactly ``[from_offset, until_offset)`` of one partition: it assigns the partition,
seeks to ``from_offset`` and polls until its position reaches ``until_offset`` (records past the
end, fetched ahead, are dropped). Nothing here is created before ``read()`` runs: gRPC channels
and the consumer's I/O thread cannot be pickled.

Data loss: the consumer runs with ``auto_offset_reset='none'``, so offsets deleted by retention
(or delete-records) before the task reached them answer OFFSET_OUT_OF_RANGE instead of silently
moving on. The task then compares its position with the log: records below the log start are
gone. With ``failOnDataLoss`` it fails with :class:`DataLossError` naming the partition and the
offsets; without, it logs a warning saying which records it skips and reads on from the log start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from gateway.client import Consumer, TopicPartition
from gateway.client.errors import OffsetOutOfRangeError
from spark_jobs.offsets import OffsetRange
from spark_jobs.options import sdk_settings

log = logging.getLogger("spark_jobs.source")

#: Rows per Arrow batch handed to Spark: large enough to amortise per-batch costs, small enough
#: to keep a task's memory flat.
BATCH_ROWS = 20_000
#: Bytes fetched per partition per request: four times the SDK default, since a task reads one
#: partition and wants it as fast as it comes.
FETCH_BYTES = 4 * 1024 * 1024


class DataLossError(RuntimeError):
    """Records of a range were deleted before they were read, and ``failOnDataLoss`` is true."""


class ReadTimeoutError(RuntimeError):
    """Records a range expects did not arrive within ``pollTimeoutMs``."""


@dataclass(frozen=True)
class RangeReadSettings:
    """How executors read; pickled with every task."""

    servers: str
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    isolation_level: str = "read_uncommitted"
    #: The SDK's TLS settings; empty: plaintext.
    security: tuple[tuple[str, str], ...] = ()


def read_range(rng: OffsetRange, settings: RangeReadSettings) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` as Arrow record batches, in offset order.

    The consumer's ``poll_arrow`` decodes fetched batches straight into Arrow buffers, so no
    Python object is made per record; a batch of at most :data:`BATCH_ROWS` rows per poll.
    """
    if rng.size <= 0:
        return
    with Consumer(
        servers=settings.servers,
        auto_offset_reset="none",
        max_poll_records=BATCH_ROWS,
        max_partition_fetch_bytes=FETCH_BYTES,
        client_id="tributary-spark",
        isolation_level=settings.isolation_level,
        **sdk_settings(settings.security),
    ) as consumer:
        yield from _poll_range(consumer, rng, settings)


def _poll_range(
    consumer: Consumer, rng: OffsetRange, settings: RangeReadSettings
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``rng``; stops once the consumer's position reaches the range end."""
    tp = rng.topic_partition
    consumer.assign([tp])
    consumer.seek(tp, rng.from_offset)
    position = rng.from_offset
    last_progress = time.monotonic()
    while position < rng.until_offset:
        try:
            table = consumer.poll_arrow(timeout_ms=500, include_headers=settings.include_headers)
        except OffsetOutOfRangeError as exc:
            position = _skip_lost(consumer, rng, position, settings, exc)
            continue
        for batch in table.to_batches():
            yield _before(batch, rng.until_offset)  # only the last poll overshoots
        moved = consumer.position(tp)
        if moved > position:
            position, last_progress = moved, time.monotonic()
        elif time.monotonic() - last_progress > settings.poll_timeout_ms / 1000.0:
            raise ReadTimeoutError(
                f"reading {rng}: no record after offset {position} within "
                f"{settings.poll_timeout_ms} ms (pollTimeoutMs)"
            )


def _before(batch: pa.RecordBatch, until_offset: int) -> pa.RecordBatch:
    """The rows of ``batch`` (one partition's, in offset order) with offsets below ``until_offset``."""
    offsets = batch.column("offset")
    if not len(offsets) or offsets[-1].as_py() < until_offset:
        return batch
    keep = pc.sum(pc.less(offsets, until_offset)).as_py() or 0
    return batch.slice(0, keep)


def _skip_lost(
    consumer: Consumer,
    rng: OffsetRange,
    position: int,
    settings: RangeReadSettings,
    error: OffsetOutOfRangeError,
) -> int:
    """Where reading goes on after OFFSET_OUT_OF_RANGE at ``position``; raises or warns per failOnDataLoss."""
    tp = rng.topic_partition
    log_start = consumer.beginning_offsets([tp])[tp]
    log_end = consumer.end_offsets([tp])[tp]
    if position < log_start:
        resume = min(log_start, rng.until_offset)
        why = (
            f"deleted (retention or delete-records) before they were read; the log now starts at {log_start}"
        )
    elif position > log_end:
        resume = rng.until_offset
        why = f"no longer in the log, which now ends at {log_end} (truncated or re-created)"
    else:
        raise error  # the position is valid again: not a loss, a real failure
    report_data_loss(tp, position, resume, why, fail=settings.fail_on_data_loss)
    consumer.seek(tp, resume)
    return resume


def report_data_loss(tp: TopicPartition, first: int, until: int, why: str, *, fail: bool) -> None:
    """Fail (``failOnDataLoss=true``) or warn that offsets ``[first, until)`` of ``tp`` are lost."""
    what = f"offsets {first} to {until - 1} ({until - first} records) of {tp}"
    if fail:
        raise DataLossError(f"data loss: {what} were {why}. Set failOnDataLoss=false to skip them and go on.")
    log.warning("failOnDataLoss=false: skipping %s: they were %s", what, why)
