"""Correlation ids wrap before they stop fitting a frame's signed 32-bit field."""

from __future__ import annotations

import itertools
import struct

from services.correlation_ids import MAX_CORRELATION_ID, correlation_ids


def test_ids_count_from_one_and_wrap_to_one_after_the_largest_a_frame_holds():
    assert list(itertools.islice(correlation_ids(), 3)) == [1, 2, 3]
    near_the_end = list(itertools.islice(correlation_ids(MAX_CORRELATION_ID - 1), 4))
    assert near_the_end == [MAX_CORRELATION_ID - 1, MAX_CORRELATION_ID, 1, 2]
    for correlation_id in near_the_end:
        struct.pack(">i", correlation_id)  # every id fits the frames' field
    assert MAX_CORRELATION_ID + 1 > 2**31 - 1  # the next integer would not
