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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gateway.client.errors import IllegalStateError, RequestTimedOutError

T = TypeVar("T")

_DONE = object()


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


class IOThread:
    """A daemon thread with its own event loop. ``run`` and ``call`` are thread-safe."""

    def __init__(self, name: str = "tributary-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        #: One inbox per ``run_calling_back`` in progress (nested calls stack up).
        self._inboxes: list[queue.SimpleQueue] = []
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

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
        if not self._thread.is_alive():
            coro.close()
            raise IllegalStateError("the client is closed")

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
