"""Walks concatenated batches (a segment slice, a produce payload, a fetch response) zero-copy.

Only the 12-byte log overhead of each batch is trusted to find the next one, and only after
checking it against the buffer; CRC and content checks are left to
:meth:`RecordBatchView.validate`, so a recovery scan can decide per batch.
"""

from __future__ import annotations

from collections.abc import Iterator

from services.errors import CorruptRecordError
from services.records.batch import RecordBatchView, as_byte_view
from services.records.format import BATCH_LENGTH_OFFSET, INT32, LOG_OVERHEAD, MIN_BATCH_LENGTH

_read_length = INT32.unpack_from


def iter_batches(buffer, *, allow_partial_tail: bool = False) -> Iterator[RecordBatchView]:
    """Yield a :class:`RecordBatchView` per batch in ``buffer``, in order, without copying.

    A batch length below the 49-byte minimum is corruption and always raises
    :class:`CorruptRecordError` (the walk cannot continue past it). A trailing batch that the
    buffer does not hold entirely raises too, unless ``allow_partial_tail`` is set: fetch
    responses may end with a partial batch, and then the walk stops silently before it.
    """
    view = as_byte_view(buffer)
    end = len(view)
    pos = 0
    while pos < end:
        remaining = end - pos
        if remaining >= LOG_OVERHEAD:
            (batch_length,) = _read_length(view, pos + BATCH_LENGTH_OFFSET)
            if batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"batch at byte {pos} has length {batch_length}, below the minimum {MIN_BATCH_LENGTH}"
                )
            size = batch_length + LOG_OVERHEAD
            if size <= remaining:
                yield RecordBatchView(view[pos : pos + size])
                pos += size
                continue
        else:
            size = None
        if allow_partial_tail:
            return
        wanted = "a 12-byte log overhead" if size is None else f"a {size}-byte batch"
        raise CorruptRecordError(f"truncated batch at byte {pos}: {remaining} bytes left, need {wanted}")
