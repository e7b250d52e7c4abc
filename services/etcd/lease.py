"""Leases: the value object, the shared keep-alive stream, and the owned keep-alive task.

A key attached to a lease lives only while the lease is refreshed: that is how a storage node's
registration (``brokers/<id>``) and the controller key disappear when their process dies.

* :class:`Lease` -- id and granted TTL, with one-shot :meth:`~Lease.refresh`,
  :meth:`~Lease.revoke` and :meth:`~Lease.remaining_ttl`.
* :class:`KeepAliveStream` -- the client's one ``LeaseKeepAlive`` stream, shared by every lease:
  one request, one response (etcd answers in order), reopened on the next endpoint when it breaks.
* :class:`KeepAlive` -- a task that refreshes one lease every TTL/3 (as etcd's own client does)
  and reports **loss as an event**: :attr:`KeepAlive.lost` is set (and ``on_lost`` called) when etcd
  answers TTL 0 (the lease expired or was revoked) or when no refresh succeeded before the TTL ran
  out -- after which a holder must assume its keys are gone, even if etcd was merely unreachable.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from . import _rpc
from .connection import REQUIRE_LEADER_METADATA, Backoff, Stubs
from .exceptions import EtcdClosedError, EtcdError, EtcdUnavailableError, translate_rpc_error

if TYPE_CHECKING:
    from .client import EtcdClient

log = logging.getLogger(__name__)

_ENDPOINT_FAILURE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: Never refresh more often than this, whatever the TTL.
MIN_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease: ``id`` and the ``ttl`` in seconds etcd granted.

    ``granted_at`` is the event-loop time the grant was *sent*, so the lease is known to live at
    least until ``granted_at + ttl``. The methods delegate to the client that granted it.
    """

    id: int
    ttl: int
    granted_at: float = field(default=0.0, compare=False, repr=False)
    client: EtcdClient | None = field(default=None, compare=False, repr=False)

    async def refresh(self) -> int:
        """Refresh once; return the new TTL (0 if the lease no longer exists)."""
        return await self._client().refresh_lease(self.id)

    async def revoke(self) -> bool:
        """Revoke the lease, deleting its keys; return False if it was already gone."""
        return await self._client().revoke_lease(self.id)

    async def remaining_ttl(self) -> int:
        """Seconds left before expiry as etcd sees it, or -1 if the lease does not exist."""
        return await self._client().lease_time_to_live(self.id)

    def keep_alive(self, *, on_lost: Callable[[Lease, str], Any] | None = None) -> KeepAlive:
        """A :class:`KeepAlive` for this lease (not started yet)."""
        return self._client().keep_alive(self, on_lost=on_lost)

    def _client(self) -> EtcdClient:
        if self.client is None:
            raise ValueError("this Lease is not bound to a client")
        return self.client


class _StreamState:
    """One open keep-alive stream and the callers waiting for its answers, per lease id, FIFO."""

    __slots__ = ("call", "reader", "stubs", "waiters")

    def __init__(self, call: Any, stubs: Stubs) -> None:
        self.call = call
        self.stubs = stubs
        self.waiters: dict[int, deque[asyncio.Future[int]]] = {}
        self.reader: asyncio.Task[None] | None = None


class KeepAliveStream:
    """The client's shared ``LeaseKeepAlive`` stream (opened on first use, reopened after errors)."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._state: _StreamState | None = None
        self._write_lock = asyncio.Lock()  # grpc.aio allows one write in flight per stream

    async def refresh(self, lease_id: int, timeout: float) -> int:
        """Send one keep-alive for ``lease_id``; return etcd's answer (TTL, 0 if gone).

        Raises :class:`EtcdUnavailableError` if no answer arrives within ``timeout``; the stream
        is then torn down, since an unanswered keep-alive means it is stuck or dead.
        """
        self._client.ensure_open()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        state: _StreamState | None = None
        try:
            async with asyncio.timeout(timeout):
                async with self._write_lock:
                    state = self._current_or_new_stream()
                    state.waiters.setdefault(lease_id, deque()).append(future)
                    await self._do_write(state, lease_id)
                return await future
        except TimeoutError:
            error = EtcdUnavailableError(
                f"no keep-alive answer within {timeout:.2f}s from etcd endpoint "
                f"{state.stubs.endpoint if state else self._client.current_endpoint}"
            )
            if state is not None:
                self._client.pool.fail_over(state.stubs)
                self._end(state, error)
            raise error from None

    async def close(self) -> None:
        state = self._state
        if state is not None:
            self._end(state, EtcdClosedError("etcd client is closed"))
            if state.reader is not None:
                await asyncio.gather(state.reader, return_exceptions=True)

    def _current_or_new_stream(self) -> _StreamState:
        if self._state is None:
            stubs = self._client.pool.stubs()
            call = stubs.lease.LeaseKeepAlive(metadata=REQUIRE_LEADER_METADATA)
            state = _StreamState(call, stubs)
            state.reader = asyncio.create_task(self._read_routine(state), name="etcd-lease-keepalive")
            self._state = state
        return self._state

    async def _do_write(self, state: _StreamState, lease_id: int) -> None:
        try:
            await state.call.write(_rpc.LeaseKeepAliveRequest(ID=lease_id))
        except grpc.aio.AioRpcError as error:
            # The reader sees the same failure; end here too so this caller fails right away.
            self._end(state, self._translate(state, error))
        except asyncio.InvalidStateError:
            self._end(state, EtcdUnavailableError("keep-alive stream already finished"))

    async def _read_routine(self, state: _StreamState) -> None:
        error: EtcdError
        try:
            while True:
                response = await state.call.read()
                if response is grpc.aio.EOF:
                    error = EtcdUnavailableError(f"etcd {state.stubs.endpoint} ended the keep-alive stream")
                    break
                _resolve(state, response.ID, response.TTL)
        except grpc.aio.AioRpcError as rpc_error:
            error = self._translate(state, rpc_error)
        except asyncio.CancelledError:
            self._end(state, EtcdClosedError("keep-alive stream closed"))
            raise
        self._end(state, error)

    def _translate(self, state: _StreamState, error: grpc.aio.AioRpcError) -> EtcdError:
        if error.code() in _ENDPOINT_FAILURE:
            self._client.pool.fail_over(state.stubs)
        translated = translate_rpc_error(error, state.stubs.endpoint)
        translated.__cause__ = error
        return translated

    def _end(self, state: _StreamState, error: EtcdError) -> None:
        """Forget ``state`` and fail everyone still waiting on it (no awaits: atomic)."""
        if self._state is state:
            self._state = None
        state.call.cancel()
        if state.reader is not None and state.reader is not asyncio.current_task():
            state.reader.cancel()
        for queue in state.waiters.values():
            for future in queue:
                if not future.done():
                    future.set_exception(error)
        state.waiters.clear()


def _resolve(state: _StreamState, lease_id: int, ttl: int) -> None:
    """Hand an answer to the oldest waiter for that lease (a timed-out waiter still takes its own)."""
    queue = state.waiters.get(lease_id)
    if not queue:
        return
    future = queue.popleft()
    if not future.done():
        future.set_result(ttl)


class KeepAlive:
    """Keeps one lease alive from an owned task and reports its loss.

    Start with ``async with client.keep_alive(lease) as ka:`` (stopped on exit) or
    :meth:`start`/:meth:`stop`. After loss the task ends; :attr:`lost` stays set and
    :attr:`loss_reason` says why. :meth:`stop` never reports loss.
    """

    def __init__(
        self, client: EtcdClient, lease: Lease, *, on_lost: Callable[[Lease, str], Any] | None = None
    ) -> None:
        self.lease = lease
        self.lost = asyncio.Event()
        self.loss_reason: str | None = None
        self.last_ttl = lease.ttl
        self._client = client
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> KeepAlive:
        """Start refreshing (idempotent); return ``self``."""
        if self._task is None:
            self._task = asyncio.create_task(
                self._keep_alive_routine(), name=f"etcd-keepalive-{self.lease.id:x}"
            )
            self._client.register_keep_alive(self, True)
        return self

    async def stop(self) -> None:
        """Stop refreshing (the lease then expires after its TTL unless revoked)."""
        task = self._task
        self._client.register_keep_alive(self, False)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def wait_lost(self) -> str:
        """Wait until the lease is lost; return the reason."""
        await self.lost.wait()
        return self.loss_reason or ""

    async def __aenter__(self) -> KeepAlive:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _keep_alive_routine(self) -> None:
        loop = asyncio.get_running_loop()
        ttl = self.lease.ttl
        expires_at = (self.lease.granted_at or loop.time()) + ttl
        backoff = Backoff(initial=0.05, maximum=max(MIN_INTERVAL_S, ttl / 3))
        last_error: EtcdError | None = None
        while True:
            sent_at = loop.time()
            budget = expires_at - sent_at
            if budget <= 0:
                await self._report_lost(
                    f"no refresh succeeded before the {ttl}s TTL ran out (last error: {last_error})"
                )
                return
            try:
                # Our own deadline is the lease expiry. It is not passed down as the stream's
                # timeout: a stream that misses the client timeout is torn down for everyone,
                # and a lease near expiry must not do that to a healthy stream.
                async with asyncio.timeout(budget):
                    ttl = await self._client.refresh_lease(self.lease.id)
            except EtcdClosedError:
                return
            except (EtcdError, TimeoutError) as error:
                last_error = (
                    error
                    if isinstance(error, EtcdError)
                    else EtcdUnavailableError(
                        f"no keep-alive answer within the remaining {budget:.2f}s of the TTL"
                    )
                )
                log.debug("keep-alive of lease %x failed, retrying: %s", self.lease.id, error)
                await asyncio.sleep(min(backoff.next_delay(), max(0.0, expires_at - loop.time())))
                continue
            if ttl <= 0:
                await self._report_lost("etcd says the lease expired or was revoked")
                return
            backoff.reset()
            self.last_ttl = ttl
            # Counted from when the request left: the lease lives at least that long.
            expires_at = sent_at + ttl
            await asyncio.sleep(max(MIN_INTERVAL_S, ttl / 3))

    async def _report_lost(self, reason: str) -> None:
        self.loss_reason = reason
        self.lost.set()
        self._client.register_keep_alive(self, False)
        log.warning("lease %x lost: %s", self.lease.id, reason)
        if self._on_lost is None:
            return
        try:
            result = self._on_lost(self.lease, reason)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_lost callback for lease %x failed", self.lease.id)
