"""Kafka RecordBatch v2, byte for byte: build, view, validate, walk and rewrite batches.

A pure package: it imports only ``struct``/``zlib``, the CRC-32C and compression libraries and
``services.errors``; no sockets, files or asyncio. The format itself is documented in
:mod:`services.records.format`.

* :class:`RecordBatchBuilder` -- producers build a batch.
* :class:`RecordBatchView` -- a zero-copy view of one batch: header fields, ``validate()``,
  record iteration.
* :func:`iter_batches` -- walk concatenated batches without copying.
* :func:`set_base_offset`, :func:`set_partition_leader_epoch`, :func:`set_log_append_time` --
  the broker's in-place header rewrites.
* :func:`read_batch_header` -- one ``struct`` call for hot paths that need a few header fields.
* :func:`speedups_enabled` -- whether the per-record loops run in the optional C accelerator
  (``_speedups.c``, built by ``pip install``) or in the pure-Python reference code. Set
  ``TRIBUTARY_NO_EXTENSIONS=1`` to force pure Python; results are identical either way.

Bad bytes always raise :class:`~services.errors.CorruptRecordError` (reason ``CORRUPT_MESSAGE``);
caller bugs raise ``ValueError``/``TypeError``.
"""

from services.records.batch import RecordBatchView
from services.records.builder import RecordBatchBuilder
from services.records.format import (
    LOG_OVERHEAD,
    MAGIC,
    MAX_DECOMPRESSED_SIZE,
    RECORD_BATCH_OVERHEAD,
    Compression,
    TimestampType,
)
from services.records.header import BatchHeader, read_batch_header
from services.records.inplace import set_base_offset, set_log_append_time, set_partition_leader_epoch
from services.records.record import Record, speedups_enabled
from services.records.walker import iter_batches

__all__ = [
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_DECOMPRESSED_SIZE",
    "RECORD_BATCH_OVERHEAD",
    "BatchHeader",
    "Compression",
    "Record",
    "RecordBatchBuilder",
    "RecordBatchView",
    "TimestampType",
    "iter_batches",
    "read_batch_header",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "speedups_enabled",
]
