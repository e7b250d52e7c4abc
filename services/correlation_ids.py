"""Correlation ids for the raw protocols (the data listener, the fetch and data ports): their
frames carry a signed 32-bit id, so a long-lived connection's counter must wrap before 2**31 or
its 2,147,483,648th request fails to encode. An id is reused only after two billion requests,
long after the request that last had it was answered or failed."""

from __future__ import annotations

from collections.abc import Iterator

#: The largest id a frame can carry.
MAX_CORRELATION_ID = (1 << 31) - 1


def correlation_ids(first: int = 1) -> Iterator[int]:
    """``first``, ..., MAX_CORRELATION_ID, then 1, 2, ... again (never 0 or negative: -1 marks a
    connection-level error answer)."""
    while True:
        yield from range(first, MAX_CORRELATION_ID + 1)
        first = 1
