"""A background thread running an asyncio loop: where the synchronous clients do their I/O.

The synchronous ``Producer``/``Consumer``/``Admin`` are thin shells over the same asyncio cores as
``AsyncProducer``/``AsyncConsumer``; each owns one :class:`IOThread` and hands it coroutines with
:meth:`IOThread.run`. Callbacks of produced records run on this thread too (as kafka-python runs
them on its sender thread), so they should be short.

Some callbacks must run on the *application's* thread instead: Kafka runs a consumer's rebalance
listener and its async-commit callbacks inside ``poll()``, on the thread that called it.
:meth:`IOThread.run_calling_back` runs a coroutine like :meth:`IOThread.run` and, while the
caller waits, executes on the caller's thread whatever the coroutine hands over with
:meth:`IOThread.call_back`. Such a callback may call the client again (a listener committing):
that nested call runs the same way, and the outer coroutine waits meanwhile.

A handoff to the loop and back costs two thread wakeups; :meth:`IOThread.call_while_idle` skips
both for work that needs no waiting (a consumer's ``poll`` with records already buffered): with
``idle_calls=True`` the loop thread holds a lock except while it waits for I/O in ``select``, and
a caller holding that lock may read and change the client's state on its own thread.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # C: ``signal.signal`` adds enums, ~3 us a call
import asyncio
import concurrent.futures
import inspect
import queue
import selectors
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gateway.client.errors import IllegalStateError, RequestTimedOutError

T = TypeVar("T")

_DONE = object()
_MAIN_THREAD = threading.main_thread()


async def call_directly(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` here, awaiting its result if it is awaitable (asyncio clients' callbacks)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _settle(waiter: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if waiter.done():
        return
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(result)


def _noop() -> None:
    pass


class _HeldInterrupt:
    """A SIGINT handler that only notes the signal, for :meth:`IOThread.call_if_idle` on the
    main thread: Python raises KeyboardInterrupt there at any bytecode, and one raised in the
    middle of the producer's pass (records drained from the accumulator, not yet written) would
    leave them in nobody's hands -- never sent nor failed. The application's handler runs once
    the call is over."""

    __slots__ = ("caught", "handler")

    def __init__(self, handler: Callable[[int, Any], Any]) -> None:
        self.handler = handler
        self.caught: tuple[int, Any] | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.caught = (signum, frame)

    def release(self) -> None:
        """Put the application's handler back and run it for a SIGINT held meanwhile."""
        _signal.signal(_signal.SIGINT, self.handler)
        if self.caught is not None:
            self.handler(*self.caught)


class _LockReleasingSelector(selectors.DefaultSelector):
    """The loop's selector, releasing ``lock`` while it waits for I/O: the loop thread holds the
    lock whenever it runs anything (callbacks, tasks), so whoever holds it may touch the loop's
    state from another thread."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self._lock = lock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._lock.release()
        try:
            return super().select(timeout)
        finally:
            self._lock.acquire()


class IOThread:
    """A daemon thread with its own event loop. ``run`` and ``call`` are thread-safe.

    ``idle_calls``: allow :meth:`call_while_idle` (the loop then takes a lock on each turn).
    """

    def __init__(self, name: str = "tributary-io", *, idle_calls: bool = False) -> None:
        #: Held by the loop thread except while it waits in ``select`` (None: no idle calls).
        self._idle_lock: threading.Lock | None = threading.Lock() if idle_calls else None
        #: The thread inside :meth:`call_while_idle` (it holds the loop: it must not wait for it).
        self._idle_caller: int | None = None
        if self._idle_lock is None:
            self.loop = asyncio.new_event_loop()
        else:
            self.loop = asyncio.SelectorEventLoop(_LockReleasingSelector(self._idle_lock))
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        #: One inbox per ``run_calling_back`` in progress (nested calls stack up).
        self._inboxes: list[queue.SimpleQueue] = []
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        lock = self._idle_lock
        if lock is not None:
            lock.acquire()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()
            if lock is not None:
                lock.release()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout`` seconds).

        On timeout the coroutine is cancelled and :class:`RequestTimedOutError` raised. Calling
        this from the loop thread itself (e.g. ``producer.flush()`` inside a delivery callback)
        would deadlock, so it raises :class:`IllegalStateError` instead.
        """
        self._ensure_usable(coro)
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimedOutError(f"operation did not complete within {timeout:.3f}s") from None

    def run_calling_back(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result, executing here, on the calling
        thread, the callbacks it hands over with :meth:`call_back` meanwhile.

        If the caller is interrupted (KeyboardInterrupt), the coroutine is cancelled.
        """
        self._ensure_usable(coro)
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes.append(inbox)  # before the coroutine starts: its first callback comes here
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except BaseException:
            self._inboxes.remove(inbox)
            raise
        future.add_done_callback(lambda _done: inbox.put(_DONE))
        try:
            while True:
                item = inbox.get()
                if item is _DONE:
                    return future.result()
                self._execute(*item)
        except BaseException:
            future.cancel()
            raise
        finally:
            self._inboxes.remove(inbox)

    def _execute(self, fn: Callable[..., Any], args: tuple, waiter: asyncio.Future) -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 -- handed back to the coroutine that asked
            self.loop.call_soon_threadsafe(_settle, waiter, None, exc)
        else:
            self.loop.call_soon_threadsafe(_settle, waiter, result, None)

    async def call_back(self, fn: Callable[..., Any], *args: Any) -> Any:
        """(On the loop.) Run ``fn(*args)`` on the thread waiting in :meth:`run_calling_back` and
        return its result (awaited here if awaitable); with nobody waiting, run it here."""
        if not self._inboxes:
            return await call_directly(fn, *args)
        waiter = self.loop.create_future()
        self._inboxes[-1].put((fn, args, waiter))
        result = await waiter
        if inspect.isawaitable(result):
            result = await result
        return result

    @property
    def idle_calls(self) -> bool:
        """Whether :meth:`call_while_idle` may be used: started with ``idle_calls`` and the loop
        not in asyncio's debug mode (which refuses callbacks scheduled from another thread)."""
        return self._idle_lock is not None and not self.loop.get_debug()

    def call_while_idle(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the plain function ``fn(*args)`` here, on the calling thread, while the loop waits
        for I/O (needs ``idle_calls=True``): no handoff to the loop thread and back. ``fn`` may
        read and change client state and schedule callbacks on the loop (the loop is woken to
        run them), but must not wait for the loop: it holds the loop meanwhile.

        From the loop thread itself it raises :class:`IllegalStateError`, as :meth:`run` does.
        """
        lock = self._idle_lock
        if lock is None:
            raise IllegalStateError("this I/O thread was started without idle_calls")
        if self.in_loop_thread:
            raise IllegalStateError(
                "a blocking client call was made from the client's own I/O thread "
                "(inside a callback); use the asyncio API there"
            )
        if not self._thread.is_alive():
            raise IllegalStateError("the client is closed")
        loop = self.loop
        # The loop's queues of callbacks and timers (asyncio internals, stable since 3.4):
        # whatever ``fn`` adds there is run once the loop is woken from its ``select``.
        ready, scheduled = loop._ready, loop._scheduled  # type: ignore[attr-defined]
        self._refuse_idle_caller()
        with lock:
            queued = len(ready), len(scheduled)
            self._idle_caller = threading.get_ident()
            try:
                return fn(*args)
            finally:
                self._idle_caller = None
                if (len(ready), len(scheduled)) != queued:
                    loop.call_soon_threadsafe(_noop)

    def call_if_idle(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run the plain function ``fn(*args)`` here, on the calling thread, if the loop waits for
        I/O right now (needs ``idle_calls=True``); True if it ran. Never waits for the loop: busy
        (or stopped, or not started, or asked from the loop thread), nothing runs and it returns
        False -- the caller hands the work over instead.

        As in :meth:`call_while_idle`, ``fn`` may read and change client state and schedule
        callbacks on the loop (the loop is woken to run them). It runs with the loop set as this
        thread's running loop, so code written for the loop (``asyncio.get_running_loop()``)
        runs unchanged. The producer writes a request this way (``ProducerCore.wakeup_sender``):
        no wakeup of the loop thread to write it, which was one thread handoff of the two of
        every round trip of a record sent at a time.

        On the main thread a SIGINT (Ctrl-C) is held while ``fn`` runs and handled (raised as
        KeyboardInterrupt) once it returned: ``fn`` does the loop's work, which no interrupt
        cuts in half on the loop's own thread (:class:`_HeldInterrupt`).
        """
        lock = self._idle_lock
        if lock is None or self.loop.get_debug() or self.in_loop_thread:
            return False
        held = None
        if threading.current_thread() is _MAIN_THREAD:
            handler = _signal.getsignal(_signal.SIGINT)
            if callable(handler):  # a Python handler (KeyboardInterrupt's): held during the call
                held = _HeldInterrupt(handler)
                _signal.signal(_signal.SIGINT, held)
        try:
            return self._call_if_idle(lock, fn, args)
        finally:
            if held is not None:
                held.release()

    def _call_if_idle(self, lock: threading.Lock, fn: Callable[..., Any], args: tuple) -> bool:
        if not lock.acquire(False):
            return False  # the loop is running something (or another caller holds it)
        try:
            loop = self.loop
            if not loop.is_running():
                return False  # not started yet, or stopped
            ready, scheduled = loop._ready, loop._scheduled  # type: ignore[attr-defined]
            queued = len(ready), len(scheduled)
            previous = asyncio._get_running_loop()
            self._idle_caller = threading.get_ident()
            asyncio._set_running_loop(loop)
            try:
                fn(*args)
            finally:
                asyncio._set_running_loop(previous)
                self._idle_caller = None
                if (len(ready), len(scheduled)) != queued:
                    loop.call_soon_threadsafe(_noop)
            return True
        finally:
            lock.release()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the loop thread (where client state lives) and return its result."""

        async def invoke() -> T:
            return fn(*args)

        if self.in_loop_thread:
            return fn(*args)
        return self.run(invoke())

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop without waiting (thread-safe)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def _ensure_usable(self, coro: Coroutine) -> None:
        if self.in_loop_thread:
            coro.close()
            raise IllegalStateError(
                "a blocking client call was made from the client's own I/O thread "
                "(inside a callback); use the asyncio API there"
            )
        try:
            self._refuse_idle_caller()
        except IllegalStateError:
            coro.close()
            raise
        if not self._thread.is_alive():
            coro.close()
            raise IllegalStateError("the client is closed")

    def _refuse_idle_caller(self) -> None:
        # The thread inside call_while_idle holds the loop: waiting for it would never end.
        if self._idle_caller == threading.get_ident():
            raise IllegalStateError(
                "a blocking client call was made while the client's poll holds its I/O loop "
                "(inside a deserializer); make it after poll() returns"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop, stop it, and join the thread.

        gRPC finishes a closed call's bookkeeping in tasks of its own; they are cancelled and
        awaited here so none is destroyed pending when the loop closes.
        """
        if not self._thread.is_alive():
            return
        if self.in_loop_thread:
            self.loop.stop()
            return
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_remaining(), self.loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)

    @staticmethod
    async def _cancel_remaining() -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()
