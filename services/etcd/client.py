"""The asyncio etcd v3 client every Tributary service uses: key-value, txn, leases, watches.

One :class:`EtcdClient` per process (or per cluster prefix) is the intended use: it holds the
channels, one shared lease keep-alive stream and one shared watch stream, so a coordinator with
many watches and leases still uses a handful of HTTP/2 streams.

Unary calls have a per-call deadline (``timeout``) and fail over to the next endpoint on
UNAVAILABLE. Reads and idempotent writes (put, delete, lease grant/revoke) are retried once per
endpoint; a txn that writes is retried elsewhere only when the failed endpoint never received it
(connection refused), because etcd may have applied it -- a retried compare-and-swap would
report failure for its own success.

Writes take an optional ``guard``: compares that must all hold for the write to happen, checked
in the same transaction. A failed guard raises :class:`EtcdGuardFailedError`. The coordinator
guards every metadata write with "the controller epoch is still mine".

Not thread-safe: use it from the event loop that first used it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from . import _rpc
from .connection import EndpointPool, TlsConfig, parse_endpoints
from .exceptions import (
    EtcdClosedError,
    EtcdGuardFailedError,
    EtcdLeaseNotFoundError,
    translate_rpc_error,
)
from .keyspace import KeySpace, to_bytes
from .lease import KeepAlive, KeepAliveStream, Lease
from .txn import Compare, Op, TxnResult, lease_id, txn_request, txn_result
from .values import EtcdStatus, KeyValue
from .watch import Watch, Watcher

log = logging.getLogger(__name__)

#: Keys per Range call when listing a prefix; pages are read at one pinned revision.
PAGE_SIZE = 2000

_ENDPOINT_FAILURE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# grpc's message when no connection could be made at all, i.e. the request was never sent.
_NEVER_SENT = "failed to connect"


class EtcdClient:
    """An asyncio client for an etcd v3 cluster.

    ``endpoints``: ``host:port`` strings (or one comma-separated string); ``prefix``: prepended to
    every key and stripped from every key returned, e.g. ``/tributary/<cluster>/``; ``tls``: TLS
    settings (``https://`` endpoints without ``tls`` use the system CA roots); ``timeout``:
    deadline in seconds for each unary call attempt (a call that fails over may make one
    attempt per endpoint, but a refused connection fails in about a millisecond).

    Channels are opened on first use, so a client may be built outside an event loop. Use it as an
    async context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        endpoints: list[str] | tuple[str, ...] | str,
        *,
        prefix: str = "",
        tls: TlsConfig | None = None,
        timeout: float = 5.0,
    ) -> None:
        targets, wants_tls = parse_endpoints(endpoints)
        if wants_tls and tls is None:
            tls = TlsConfig()
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = timeout
        self._tls = tls
        self.keyspace = KeySpace(prefix)
        self._pool = EndpointPool(targets, tls)
        self._keep_alive_stream = KeepAliveStream(self)
        self._watcher = Watcher(self)
        self._keep_alives: set[KeepAlive] = set()
        self._closed = False

    # -- properties and lifecycle ------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self.keyspace.prefix

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._pool.endpoints

    @property
    def current_endpoint(self) -> str:
        """The endpoint the next call goes to."""
        return self._pool.current_endpoint

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop keep-alives (without reporting loss), end watches, close the channels."""
        if self._closed:
            return
        self._closed = True
        for keep_alive in list(self._keep_alives):
            await keep_alive.stop()
        await self._watcher.close()
        await self._keep_alive_stream.close()
        await self._pool.close()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def with_prefix(self, prefix: str) -> EtcdClient:
        """A new client (its own channels) on the same endpoints and settings, another prefix."""
        return EtcdClient(self.endpoints, prefix=prefix, tls=self._tls, timeout=self.timeout)

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """The key, or ``None`` if it does not exist."""
        response = await self.do_unary("kv", "Range", _rpc.RangeRequest(key=self.keyspace.encode(key)))
        return self.keyspace.key_value(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str = "") -> tuple[list[KeyValue], int]:
        """Every key starting with ``prefix``, sorted by key, and the revision they were read at.

        Large ranges are read in pages at one pinned revision, so the result is a consistent
        snapshot; watching from ``revision + 1`` misses nothing.
        """
        key, range_end = self.keyspace.prefix_range(prefix)
        return await self.range(key, range_end)

    async def range(self, key: bytes, range_end: bytes) -> tuple[list[KeyValue], int]:
        """Raw ``[key, range_end)`` listing (absolute etcd keys); see :meth:`get_prefix`."""
        kvs: list[KeyValue] = []
        revision = 0
        start = key
        while True:
            request = _rpc.RangeRequest(key=start, range_end=range_end, limit=PAGE_SIZE, revision=revision)
            response = await self.do_unary("kv", "Range", request)
            revision = revision or response.header.revision
            kvs.extend(self.keyspace.key_value(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return kvs, revision
            start = response.kvs[-1].key + b"\x00"  # the smallest key after the last one read

    async def status(self) -> EtcdStatus:
        """Maintenance status of the member behind the current endpoint (a health check)."""
        response = await self.do_unary("maintenance", "Status", _rpc.StatusRequest())
        return EtcdStatus(
            endpoint=self._pool.current_endpoint,  # the one that answered (failover moves it)
            version=response.version,
            member_id=response.header.member_id,
            leader=response.leader,
            revision=response.header.revision,
            raft_term=response.raftTerm,
            raft_index=response.raftIndex,
            raft_applied_index=response.raftAppliedIndex,
            db_size=response.dbSize,
            db_size_in_use=response.dbSizeInUse,
            is_learner=response.isLearner,
            errors=tuple(response.errors),
        )

    # -- writes --------------------------------------------------------------------------------

    async def put(
        self, key: str, value: bytes | str, lease: Any = None, *, guard: Sequence[Compare] = ()
    ) -> int:
        """Store ``value`` under ``key`` (attached to ``lease`` if given); return the revision."""
        if guard:
            result = await self.txn((), (Op.put(key, value, lease),), guard=guard)
            return result.revision
        request = _rpc.PutRequest(key=self.keyspace.encode(key), value=to_bytes(value), lease=lease_id(lease))
        response = await self.do_unary("kv", "Put", request)
        return response.header.revision

    async def delete(self, key: str, *, guard: Sequence[Compare] = ()) -> bool:
        """Delete ``key``; return whether it existed."""
        if guard:
            result = await self.txn((), (Op.delete(key),), guard=guard)
            return bool(result.results[0])
        request = _rpc.DeleteRangeRequest(key=self.keyspace.encode(key))
        response = await self.do_unary("kv", "DeleteRange", request)
        return response.deleted > 0

    async def delete_prefix(self, prefix: str, *, guard: Sequence[Compare] = ()) -> int:
        """Delete every key starting with ``prefix``; return how many were deleted."""
        if guard:
            result = await self.txn((), (Op.delete_prefix(prefix),), guard=guard)
            deleted = result.results[0]  # a delete's result: how many keys it deleted
            return deleted if isinstance(deleted, int) else 0
        key, range_end = self.keyspace.prefix_range(prefix)
        request = _rpc.DeleteRangeRequest(key=key, range_end=range_end)
        response = await self.do_unary("kv", "DeleteRange", request)
        return response.deleted

    async def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[Op],
        failure: Iterable[Op] = (),
        *,
        guard: Sequence[Compare] = (),
    ) -> TxnResult:
        """Run ``success`` if every compare holds, else ``failure``, atomically.

        With ``guard``, nothing at all happens unless every guard compare holds too, and a failed
        guard raises :class:`EtcdGuardFailedError` (so ``succeeded`` keeps meaning "my compares
        held").
        """
        compares, ok_ops, fail_ops, guards = tuple(compare), tuple(success), tuple(failure), tuple(guard)
        request = txn_request(self.keyspace, compares, ok_ops, fail_ops, guards)
        writes = any(op.is_write for op in ok_ops + fail_ops)
        response = await self.do_unary("kv", "Txn", request, idempotent=not writes)
        result = txn_result(
            self.keyspace, response, guarded=bool(guards), nested=bool(guards) and bool(compares)
        )
        if result is None:
            raise EtcdGuardFailedError(
                "guard failed: " + ", ".join(f"{g.key} {g.target} {g.op} {g.operand!r}" for g in guards)
            )
        return result

    async def create_if_absent(
        self, key: str, value: bytes | str, lease: Any = None, *, guard: Sequence[Compare] = ()
    ) -> bool:
        """Create ``key`` only if it does not exist (one txn); return whether this call created it.

        If the key exists with this very value and lease -- the trace of an earlier attempt that
        was applied although its answer was lost -- this also returns True.
        """
        data = to_bytes(value)
        result = await self.txn(
            (Compare.absent(key),), (Op.put(key, data, lease),), (Op.get(key),), guard=guard
        )
        if result.succeeded:
            return True
        existing = result.kvs(0)
        if not existing or lease_id(lease) == 0:
            return False
        return existing[0].value == data and existing[0].lease == lease_id(lease)

    async def compare_and_swap(
        self,
        key: str,
        new_value: bytes | str,
        *,
        expected_value: bytes | str | None = None,
        expected_mod_revision: int | None = None,
        lease: Any = None,
        guard: Sequence[Compare] = (),
    ) -> bool:
        """Write ``new_value`` only if the key still holds ``expected_value`` -- or was last
        modified at ``expected_mod_revision`` (0: the key must not exist). Give exactly one.
        Return whether the write happened."""
        if (expected_value is None) == (expected_mod_revision is None):
            raise ValueError("give exactly one of expected_value and expected_mod_revision")
        if expected_value is not None:
            condition = Compare.value(key, expected_value)
        else:
            condition = Compare.mod_revision(key, expected_mod_revision or 0)
        result = await self.txn((condition,), (Op.put(key, new_value, lease),), guard=guard)
        return result.succeeded

    async def delete_if_value(self, key: str, value: bytes | str, *, guard: Sequence[Compare] = ()) -> bool:
        """Delete ``key`` only if it still holds ``value``; return whether it was deleted."""
        result = await self.txn((Compare.value(key, value),), (Op.delete(key),), guard=guard)
        return result.succeeded

    async def compact(self, revision: int, *, physical: bool = False) -> None:
        """Discard history before ``revision`` (watches resuming from older revisions resync)."""
        await self.do_unary("kv", "Compact", _rpc.CompactionRequest(revision=revision, physical=physical))

    # -- leases --------------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> Lease:
        """A new lease of ``ttl`` seconds (etcd may raise it to its minimum TTL).

        Nothing keeps it alive: use :meth:`keep_alive` or :meth:`Lease.refresh`.
        """
        loop_time = asyncio.get_running_loop().time()
        response = await self.do_unary("lease", "LeaseGrant", _rpc.LeaseGrantRequest(TTL=ttl))
        return Lease(id=response.ID, ttl=response.TTL, granted_at=loop_time, client=self)

    async def revoke_lease(self, lease: Any) -> bool:
        """Revoke a lease, deleting its keys; return False if it no longer existed."""
        try:
            await self.do_unary("lease", "LeaseRevoke", _rpc.LeaseRevokeRequest(ID=lease_id(lease)))
        except EtcdLeaseNotFoundError:
            return False
        return True

    async def lease_time_to_live(self, lease: Any) -> int:
        """Seconds the lease has left (rounded down by etcd), or -1 if it does not exist."""
        request = _rpc.LeaseTimeToLiveRequest(ID=lease_id(lease))
        response = await self.do_unary("lease", "LeaseTimeToLive", request)
        return response.TTL

    async def refresh_lease(self, lease: Any, *, timeout: float | None = None) -> int:
        """One keep-alive round trip on the shared stream; the new TTL, 0 if the lease is gone."""
        return await self._keep_alive_stream.refresh(lease_id(lease), timeout or self.timeout)

    def keep_alive(self, lease: Lease, *, on_lost: Callable[[Lease, str], Any] | None = None) -> KeepAlive:
        """A :class:`KeepAlive` for ``lease`` (not started: ``async with`` it, or ``start()``)."""
        return KeepAlive(self, lease, on_lost=on_lost)

    # -- watches -------------------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, start_revision: int | None = None, *, prev_kv: bool = False, snapshot: bool = False
    ) -> Watch:
        """Watch every key starting with ``prefix``, from ``start_revision`` (default: now).

        Returns once etcd has confirmed the watch, so every later write is seen. The
        :class:`Watch` survives disconnects and etcd restarts (it resumes after the last revision
        it delivered) and compaction (it yields a :class:`WatchResync`). With ``snapshot`` (and no
        ``start_revision``) the first item is a :class:`WatchResync` of the current contents.
        """
        key, range_end = self.keyspace.prefix_range(prefix)
        return await self._watcher.open(key, range_end, start_revision, prev_kv=prev_kv, snapshot=snapshot)

    async def watch_key(
        self, key: str, start_revision: int | None = None, *, prev_kv: bool = False, snapshot: bool = False
    ) -> Watch:
        """Watch one key; see :meth:`watch_prefix`."""
        return await self._watcher.open(
            self.keyspace.encode(key), b"", start_revision, prev_kv=prev_kv, snapshot=snapshot
        )

    async def watch_prefix_with_snapshot(self, prefix: str, *, prev_kv: bool = False) -> Watch:
        """Watch ``prefix``, yielding first a :class:`WatchResync` with its current contents.

        The snapshot and the events that follow fit together exactly: events start at the
        revision after the snapshot's.
        """
        return await self.watch_prefix(prefix, prev_kv=prev_kv, snapshot=True)

    # -- plumbing shared with lease.py and watch.py ----------------------------------------------

    def ensure_open(self) -> None:
        """Raise :class:`EtcdClosedError` once the client is closed."""
        if self._closed:
            raise EtcdClosedError("etcd client is closed")

    @property
    def pool(self) -> EndpointPool:
        return self._pool

    def register_keep_alive(self, keep_alive: KeepAlive, active: bool) -> None:
        if active:
            self._keep_alives.add(keep_alive)
        else:
            self._keep_alives.discard(keep_alive)

    async def do_unary(self, service: str, method: str, request: Any, *, idempotent: bool = True) -> Any:
        """One unary call with the deadline, endpoint failover and error translation."""
        self.ensure_open()
        attempts = len(self._pool.endpoints)
        for attempt in range(attempts):
            stubs = self._pool.stubs()
            rpc = getattr(getattr(stubs, service), method)
            try:
                return await rpc(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as error:
                if error.code() in _ENDPOINT_FAILURE:
                    self._pool.fail_over(stubs)
                if attempt + 1 < attempts and _may_retry_elsewhere(error, idempotent):
                    log.debug(
                        "etcd %s.%s failed on %s, trying the next endpoint: %s",
                        service,
                        method,
                        stubs.endpoint,
                        error.details(),
                    )
                    continue
                raise translate_rpc_error(error, stubs.endpoint) from error
        raise AssertionError("unreachable: the last attempt always returns or raises")


def _may_retry_elsewhere(error: grpc.aio.AioRpcError, idempotent: bool) -> bool:
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    return idempotent or _NEVER_SENT in (error.details() or "")
