"""Retrying per-partition work after metadata refreshes, within a request's deadline.

Produce and ListOffsets send each partition to its leader. A partition that fails with a retriable
error (``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE``, an unreachable node, a partition the
node has not created yet) is tried again after the metadata is refreshed, with exponential
backoff, until it succeeds, fails for good, or the deadline leaves no room for another attempt.
The other partitions keep their first answers: one bad partition does not hold the rest back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Protocol, TypeVar

from services import errors

K = TypeVar("K", bound=Hashable)

INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
#: Do not start an attempt with less time than this left: it could not get an answer back.
MIN_ATTEMPT_S = 0.02


class HasError(Protocol):
    @property
    def error(self) -> errors.TributaryError | None: ...  # read-only: results are frozen


R = TypeVar("R", bound=HasError)


def is_retriable(error: errors.TributaryError | None) -> bool:
    return error is not None and error.retriable


async def retry_partitions(
    keys: Iterable[K],
    attempt: Callable[[list[K], float], Awaitable[dict[K, R]]],
    *,
    refresh: Callable[[], Awaitable[object]],
    deadline: float,
    on_final: Callable[[K, R], None] | None = None,
    first: dict[K, R] | None = None,
) -> dict[K, R]:
    """Run ``attempt(pending_keys, deadline)`` until no key has a retriable error or time is up.

    ``attempt`` returns a result for every key it was given; ``deadline`` is on the event loop's
    clock. Between rounds the metadata is refreshed and the backoff doubles (50 ms .. 1 s), cut
    short so that a last attempt still starts before the deadline. ``on_final(key, result)`` is
    called for each key as soon as its result is final (after the attempt that settled it), so a
    caller can act on the settled keys while others still wait for a retry. ``first``: the
    results of a first attempt already made (every key's), taken as this loop's first round.
    """
    loop = asyncio.get_running_loop()
    pending = list(keys)
    results: dict[K, R] = {}
    backoff = INITIAL_BACKOFF_S
    while pending:
        if first is not None:
            round_results, first = first, None
        else:
            round_results = await attempt(pending, deadline)
        results.update(round_results)
        retry = [k for k in pending if is_retriable(round_results[k].error)]
        last = not retry or deadline - loop.time() < 2 * MIN_ATTEMPT_S
        if on_final is not None:
            for k in pending if last else (k for k in pending if not is_retriable(round_results[k].error)):
                on_final(k, round_results[k])
        pending = retry
        if last:
            break
        await refresh()
        # The last attempt is made just before the deadline rather than not at all.
        await asyncio.sleep(max(0.0, min(backoff, deadline - loop.time() - MIN_ATTEMPT_S)))
        backoff = min(backoff * 2, MAX_BACKOFF_S)
    return results
