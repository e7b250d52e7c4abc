"""Futures of produced records: one shared result per batch, one light future per record.

A batch resolves once (its base offset or its error) through :class:`ProduceResult`; each record's
:class:`FutureRecordMetadata` only remembers its batch and its position in it, and computes its
``RecordMetadata`` on demand. Completing a batch of 500 records therefore costs one event, not
500 (kafka-python's ``FutureProduceResult`` / ``FutureRecordMetadata`` split).

A record future works from both worlds: threads call ``get(timeout)``; coroutines ``await`` it.
Callbacks run on the thread that completes the batch (the client's I/O thread), as in
kafka-python; keep them short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from gateway.client.errors import RequestTimedOutError, TributaryError
from gateway.client.structs import RecordMetadata, TopicPartition
from services.records.record import speedups as _speedups

log = logging.getLogger(__name__)

#: The lock of every ProduceResult's state. Shared: one is made per batch on the application's
#: thread, and at one record per request a lock of its own was ~3% of ``send``; each holder
#: only reads or sets a few fields under it (listeners and waiters run outside it), so the
#: threads sharing it hardly ever wait for it.
_RESULT_LOCK = threading.Lock()

#: Stops the garbage collector tracking an object (C only; without it, objects stay tracked).
_untrack = getattr(_speedups, "untrack", None)  # None without the C module (or a stale build)
#: Has the collector track an object again (C only).
_track = getattr(_speedups, "track", None)

#: What the accumulator untracks each record's new future with: None unless the C module can
#: track it again too. A future refers to its batch's result and two ints, and the result leads
#: back to it only through a listener that holds it (``add_callback`` and the like), which
#: tracks the future again first -- so no cycle passes through an untracked future. (Kept in a
#: list, as the batched bench keeps them, the collector walked every record's future in every
#: full collection: 9 of them took 0.83 s of a 4.1 s run, ~20% of the producer's time.) Left
#: alone: a failed result's error, whose traceback frames are the sender's, not the caller's.
untrack_new_future = _untrack if _track is not None else None


class ProduceResult:
    """The outcome of one produced batch, shared by the futures of its records. Thread-safe."""

    __slots__ = (
        "_done",
        "_first_listener",
        "_gate",
        "_lock",
        "_more_listeners",
        "base_offset",
        "error",
        "log_append_time",
        "log_start_offset",
        "topic_partition",
    )

    def __init__(self, topic_partition: TopicPartition) -> None:
        self.topic_partition = topic_partition
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        self.error: BaseException | None = None
        self._done = False
        # What blocking waiters wait on, made only when someone waits: a lock held until the
        # result is done (each waiter lets the next through). Not an Event: a Condition, two
        # locks and a deque made in Python, and a notify in Python when done -- with one record
        # at a time (send, get, send) on both threads' paths of every round trip.
        self._gate: threading.Lock | None = None
        # The first listener, and a list only for more: a batch of one record (one record per
        # request) often has one listener, and every object here that the garbage collector
        # tracks is walked by each of its collections while the record waits to be sent.
        self._first_listener: Callable[[ProduceResult], None] | None = None
        self._more_listeners: list[Callable[[ProduceResult], None]] | None = None
        self._lock = _RESULT_LOCK

    @property
    def done(self) -> bool:
        return self._done

    def complete(
        self,
        base_offset: int = -1,
        log_append_time: int = -1,
        log_start_offset: int = -1,
        error: BaseException | None = None,
    ) -> None:
        """Resolve the batch (only the first call counts) and run the listeners."""
        with self._lock:
            if self._done:
                return
            self.base_offset, self.log_append_time = base_offset, log_append_time
            self.log_start_offset, self.error = log_start_offset, error
            first, more = self._first_listener, self._more_listeners
            self._first_listener = self._more_listeners = None
            self._done = True
            if self._gate is not None:
                self._gate.release()
        if error is None and _untrack is not None:
            # Settled without an error, it refers to nothing that could lead back to it (its
            # partition, perhaps a lock), now or later: no reference cycle can pass through
            # it, and the collector need not walk it. (A producer whose caller keeps its
            # futures -- one per record -- kept the collector walking them all, again and again.)
            _untrack(self)
        if first is not None:
            self._call(first)
            if more is not None:
                for listener in more:
                    self._call(listener)

    def _call(self, listener: Callable[[ProduceResult], None]) -> None:
        try:
            listener(self)
        except Exception:
            log.exception("error in a produce callback for %s", self.topic_partition)

    def add_listener(self, listener: Callable[[ProduceResult], None]) -> None:
        """Call ``listener(self)`` when done (at once, in this thread, if already done)."""
        with self._lock:
            if not self._done:
                if self._first_listener is None:
                    self._first_listener = listener
                elif self._more_listeners is None:
                    self._more_listeners = [listener]
                else:
                    self._more_listeners.append(listener)
                return
        listener(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done, up to ``timeout`` seconds; True once done."""
        if self._done:
            return True
        with self._lock:
            if self._done:
                return True
            gate = self._gate
            if gate is None:
                gate = self._gate = threading.Lock()
                gate.acquire()
        if timeout is None:
            passed = gate.acquire()
        elif timeout > 0:
            passed = gate.acquire(True, timeout)
        else:
            passed = gate.acquire(False)
        if passed:
            gate.release()  # the next waiter's turn
        return passed or self._done


async def wait_for_result(result: ProduceResult) -> None:
    """Wait (in a coroutine) until ``result`` is done, without raising its error."""
    if result.done:
        return
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    result.add_listener(lambda done: _wake_waiter(loop, waiter, done))
    await waiter


def _wake_waiter(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future, _result: ProduceResult) -> None:
    if asyncio._get_running_loop() is loop:
        if not waiter.done():
            waiter.set_result(None)
        return
    loop.call_soon_threadsafe(_set_if_pending, waiter)


def _set_if_pending(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class FutureRecordMetadata:
    """The future of one produced record; resolves to :class:`RecordMetadata` or raises.

    kafka-python's shape: ``get(timeout)``, ``is_done``, ``succeeded()``, ``failed()``,
    ``value``, ``exception``, ``add_callback(fn, *args)`` (called as ``fn(*args, metadata)``),
    ``add_errback(fn, *args)`` (``fn(*args, exception)``), ``add_both``. Also awaitable.
    """

    __slots__ = ("_relative_offset", "_result", "_timestamp")

    def __init__(self, result: ProduceResult, relative_offset: int, timestamp: int) -> None:
        self._result = result
        self._relative_offset = relative_offset
        self._timestamp = timestamp

    # -- state -----------------------------------------------------------------------------

    @property
    def is_done(self) -> bool:
        return self._result.done

    def done(self) -> bool:
        return self._result.done

    def succeeded(self) -> bool:
        return self._result.done and self._result.error is None

    def failed(self) -> bool:
        return self._result.done and self._result.error is not None

    @property
    def exception(self) -> BaseException | None:
        return self._result.error if self._result.done else None

    @property
    def value(self) -> RecordMetadata | None:
        return self._metadata() if self.succeeded() else None

    def _metadata(self) -> RecordMetadata:
        result = self._result
        offset = result.base_offset + self._relative_offset if result.base_offset >= 0 else -1
        timestamp = result.log_append_time if result.log_append_time >= 0 else self._timestamp
        tp = result.topic_partition
        return RecordMetadata(tp.topic, tp.partition, offset, timestamp, result.log_start_offset)

    def _metadata_or_raise(self) -> RecordMetadata:
        if self._result.error is not None:
            raise self._result.error
        return self._metadata()

    # -- waiting ---------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Block until the record is acknowledged; raise its error, or RequestTimedOutError."""
        if not self._result.wait(timeout):
            raise RequestTimedOutError(f"record not acknowledged within {timeout}s")
        return self._metadata_or_raise()

    def __await__(self):
        if not self._result.done:
            yield from wait_for_result(self._result).__await__()
        return self._metadata_or_raise()

    # -- callbacks -------------------------------------------------------------------------

    def add_callback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """On success call ``fn(*args, metadata, **kwargs)``."""
        if _track is not None:
            _track(self)  # its result now leads back to it (see ``untrack_new_future``)
        self._result.add_listener(_OnSuccess(self, fn, args, kwargs))
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """On failure call ``fn(*args, exception, **kwargs)``."""
        if _track is not None:
            _track(self)  # ``fn`` or its arguments may hold this future
        self._result.add_listener(_OnFailure(fn, args, kwargs))
        return self

    def add_both(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, metadata_or_exception, **kwargs)`` either way."""
        self.add_callback(fn, *args, **kwargs)
        return self.add_errback(fn, *args, **kwargs)

    def add_delivery_callback(
        self, on_delivery: Callable[[BaseException | None, RecordMetadata | None], Any]
    ) -> None:
        """confluent-kafka's ``on_delivery(err, metadata)``: exactly one of them is None."""

        if _track is not None:
            _track(self)  # the listener holds this future (see ``untrack_new_future``)

        def listener(result: ProduceResult) -> None:
            if result.error is None:
                on_delivery(None, self._metadata())
            else:
                on_delivery(result.error, None)

        self._result.add_listener(listener)

    def __repr__(self) -> str:
        state = "pending" if not self.is_done else ("failed" if self.failed() else "done")
        return f"<FutureRecordMetadata {self._result.topic_partition} #{self._relative_offset} {state}>"


class _OnSuccess:
    """``add_callback``'s listener. One object, not a closure: a closure over the future, the
    function and its arguments was a function, a tuple and four cells, each tracked by the
    garbage collector while the record waits (one record per request: a callback a record, and
    the collector's walks of those objects were a third of the producer's time)."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(
        self, future: FutureRecordMetadata, fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __call__(self, result: ProduceResult) -> None:
        if result.error is None:
            future = self.future
            if _untrack is not None:
                # It refers only to its settled result, which leads back to nothing (see
                # ProduceResult.complete): the collector need not walk it either.
                _untrack(future)
            self.fn(*self.args, future._metadata(), **self.kwargs)


class _OnFailure:
    """``add_errback``'s listener (see :class:`_OnSuccess`)."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __call__(self, result: ProduceResult) -> None:
        if result.error is not None:
            self.fn(*self.args, result.error, **self.kwargs)


def failed_future(
    topic_partition: TopicPartition, error: TributaryError, timestamp: int = -1
) -> FutureRecordMetadata:
    """A record future that has already failed (a record rejected before it was queued)."""
    result = ProduceResult(topic_partition)
    result.complete(error=error)
    return FutureRecordMetadata(result, 0, timestamp)
