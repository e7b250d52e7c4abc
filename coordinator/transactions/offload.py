"""Work that grows with a request, moved off the event loop once it is large enough to matter.

The active controller's event loop also keeps the election lease alive and answers every other
call; a transaction of tens of thousands of partitions takes tens of milliseconds to decode,
check, merge or encode. Below :data:`OFF_LOOP_SIZE` items the thread hand-off would cost more
than the work, so small requests -- nearly all of them -- stay on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Items (partitions, offsets) from which work runs in a worker thread. Encoding the metadata of
#: a 40,000-partition transaction takes ~30 ms; 2,000 items take ~1 ms.
OFF_LOOP_SIZE = 2_000


async def off_loop_if_large(size: int, function: Callable[..., T], *args) -> T:
    """``function(*args)``, in a worker thread when ``size`` says it may take milliseconds.
    ``function`` must not change what the event loop shares, and may only look up (never
    iterate) the metadata cache's dicts, which the loop changes in place."""
    if size < OFF_LOOP_SIZE:
        return function(*args)
    return await asyncio.to_thread(function, *args)
