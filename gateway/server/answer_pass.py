"""Work deferred to the end of the callback that hands out storage-node answers.

The gateway's data-port connections to storage nodes read answer frames in their protocol's
``data_received`` (``node_appends.py``), and the appends those answers settle call back into
the data listener, which has client answers to write. Written one by one, each would cost a
system call; scheduled with ``call_soon``, they cost a turn of the event loop between the node's
answer and the client's. Instead, while answers are handed out (:func:`handing_out`), a writer
defers its flush to the end of that pass (:func:`defer`): answers settled by one read leave in
one write per client connection, in the same callback that read them.

One pass per thread at a time (an event loop's callbacks do not nest): the state is
thread-local, so event loops on other threads (tests) do not see it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class _Pass(threading.local):
    #: The callbacks deferred to the end of the pass under way; None: no pass under way.
    deferred: list[Callable[[], None]] | None = None


_pass = _Pass()


def defer(callback: Callable[[], None]) -> bool:
    """Run ``callback`` at the end of the pass under way (True), or do nothing and return False
    when no pass is under way (the caller schedules it otherwise)."""
    deferred = _pass.deferred
    if deferred is None:
        return False
    deferred.append(callback)
    return True


@contextmanager
def handing_out() -> Iterator[None]:
    """A pass: answers are handed out inside; what was deferred runs at its end (a callback's
    exception is logged, and the others still run). A pass inside a pass is part of it."""
    if _pass.deferred is not None:
        yield
        return
    deferred: list[Callable[[], None]] = []
    _pass.deferred = deferred
    try:
        yield
    finally:
        _pass.deferred = None
        for callback in deferred:
            try:
                callback()
            except Exception:
                log.exception("a deferred answer write failed")
