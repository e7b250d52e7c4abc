"""Leader election on one key, plus the epoch counter that fences a deposed leader.

How :class:`Election` works (the ownership idiom of python-etcd3's lock, on a lease):

* campaign: grant a lease and keep it alive from that moment -- also while *waiting* (etcd3aio
  let a waiting candidate's lease lapse, so its win was void); then one txn "if the election key
  does not exist, put my value with my lease, else read it". The loser watches the key from the
  revision after the holder's last write and tries again once it is deleted.
* leadership is identified by the key's ``create_revision`` (not its value, which
  :meth:`Election.proclaim` may change): :meth:`Election.guard` is the compare "the key is still
  the one I created", for writes that only a leader may make.
* leadership ends when the lease is lost (etcd says expired, or no refresh succeeded within the
  TTL) or the key is deleted or replaced behind our back: :attr:`Election.lost` is set and
  ``on_lost`` called. :meth:`Election.resign` gives it up on purpose (and does not set ``lost``).

:func:`increment_counter` is the epoch helper: after winning, the controller bumps a persistent
epoch key in one txn guarded by that key's ``mod_revision`` (and by leadership), and then fences
every metadata write with :func:`epoch_guard` -- a controller whose epoch is no longer current can
write nothing, even if it has not yet noticed that it lost.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.log_limit import RepeatedLog

from .connection import Backoff
from .exceptions import (
    EtcdClosedError,
    EtcdError,
    EtcdGuardFailedError,
    EtcdLeaseNotFoundError,
    EtcdUnavailableError,
    NotLeaderError,
)
from .keyspace import to_bytes
from .lease import KeepAlive, Lease
from .txn import Compare, Op
from .values import EventType, KeyValue, WatchResync

if TYPE_CHECKING:
    from .client import EtcdClient

log = logging.getLogger(__name__)
#: A campaign retrying through an etcd outage logs once, then a count of the retries.
_repeats = RepeatedLog(log)
_CAMPAIGN_RETRY = "campaign for %r: etcd unavailable, retrying: %s"

_UNSET = object()


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The current holder of an election key: its value (the candidate id unless proclaimed
    otherwise), the revision that created the key (one per term) and its lease."""

    key: str
    value: bytes
    create_revision: int
    lease: int

    @classmethod
    def from_kv(cls, kv: KeyValue) -> LeaderInfo:
        return cls(kv.key, kv.value, kv.create_revision, kv.lease)


def epoch_guard(epoch_key: str, epoch: int) -> Compare:
    """The compare "``epoch_key`` still holds ``epoch``": guard every write of an epoch's leader."""
    return Compare.value(epoch_key, str(epoch))


async def increment_counter(client: EtcdClient, key: str, *, guard: Sequence[Compare] = ()) -> int:
    """Add one to the decimal counter at ``key`` (absent counts as 0); return the new value.

    One txn per attempt, guarded by the key's ``mod_revision``, so concurrent increments never
    return the same value. Raises :class:`EtcdGuardFailedError` if ``guard`` fails.
    """
    current = await client.get(key)
    while True:
        value = int(current.value) if current else 0
        result = await client.txn(
            (Compare.mod_revision(key, current.mod_revision if current else 0),),
            (Op.put(key, str(value + 1)),),
            (Op.get(key),),
            guard=guard,
        )
        if result.succeeded:
            return value + 1
        found = result.kvs(0)
        current = found[0] if found else None


class Election:
    """One candidate in the election on key ``name`` (relative to the client prefix).

    ``candidate_id`` identifies this process; the key's value is ``value`` if given, else the
    candidate id. ``ttl`` is the lease TTL in seconds: how long a crashed leader blocks the
    others. ``on_lost(reason)`` (sync or async) is called when leadership is lost. Use from one
    event loop.
    """

    def __init__(
        self,
        client: EtcdClient,
        name: str,
        candidate_id: str,
        ttl: int = 5,
        *,
        value: bytes | str | None = None,
        on_lost: Callable[[str], Any] | None = None,
    ) -> None:
        self.client = client
        self.key = name
        self.candidate_id = candidate_id
        self.ttl = ttl
        self.lost = asyncio.Event()
        self.loss_reason: str | None = None
        self._value = to_bytes(value if value is not None else candidate_id)
        self._on_lost = on_lost
        self._lease: Lease | None = None
        self._keep_alive: KeepAlive | None = None
        self._leader_revision: int | None = None
        self._monitor: asyncio.Task[None] | None = None

    # -- state ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader_revision is not None

    @property
    def leader_revision(self) -> int | None:
        """The ``create_revision`` of our election key while we lead (identifies the term)."""
        return self._leader_revision

    @property
    def lease(self) -> Lease | None:
        """Our lease while campaigning or leading."""
        return self._lease

    def guard(self) -> Compare:
        """The compare "I am still the leader" for guarded writes; raises if not leader now."""
        if self._leader_revision is None:
            raise NotLeaderError(f"{self.candidate_id} is not the leader of {self.key!r}")
        return Compare.create_revision(self.key, self._leader_revision)

    # -- campaign and resign ----------------------------------------------------------------

    async def campaign(self) -> None:
        """Block until this candidate is the leader. Stays in the race through etcd outages.

        Cancel the call to withdraw; the lease is then revoked.
        """
        if self.is_leader:
            return
        backoff = Backoff(maximum=2.0)
        try:
            while True:
                try:
                    holder = await self._do_acquire(await self._live_lease())
                    _repeats.ended(_CAMPAIGN_RETRY)
                    if holder is None:
                        break
                    await self._wait_until_vacant(holder)
                    backoff.reset()
                except EtcdUnavailableError as error:
                    _repeats.info(_CAMPAIGN_RETRY, self.key, error)
                    await asyncio.sleep(backoff.next_delay())
                except EtcdLeaseNotFoundError:
                    # Our lease expired before the keep-alive noticed (e.g. a long outage).
                    await self._drop_lease()
        except BaseException:
            await self._drop_lease()
            raise
        self._begin_term()

    async def resign(self) -> None:
        """Give up leadership (or candidacy): delete our key if it is still ours, revoke the lease.

        Best effort against an unreachable etcd: once this returns we no longer act as leader,
        and the key is gone now or expires within the TTL.
        """
        revision = self._leader_revision
        self._end_term()
        if revision is not None:
            try:
                await self.client.txn((Compare.create_revision(self.key, revision),), (Op.delete(self.key),))
            except EtcdError as error:
                log.warning(
                    "resign from %r: could not delete the key (%s); it expires with the lease",
                    self.key,
                    error,
                )
        await self._drop_lease()

    async def close(self) -> None:
        """Same as :meth:`resign`."""
        await self.resign()

    # -- leader-only writes -------------------------------------------------------------------

    async def proclaim(self, value: bytes | str) -> None:
        """Change the value of our election key (e.g. to "id + epoch") without losing the term."""
        self._value = to_bytes(value)
        try:
            await self.client.put(self.key, self._value, self._lease, guard=[self.guard()])
        except EtcdGuardFailedError as error:
            raise NotLeaderError(f"{self.candidate_id} lost {self.key!r} before proclaiming") from error

    async def increment_epoch(self, epoch_key: str) -> int:
        """Bump the persistent epoch at ``epoch_key`` while still leader; return the new epoch."""
        try:
            return await increment_counter(self.client, epoch_key, guard=[self.guard()])
        except EtcdGuardFailedError as error:
            raise NotLeaderError(f"{self.candidate_id} lost {self.key!r} before bumping the epoch") from error

    # -- observation ----------------------------------------------------------------------------

    async def leader(self) -> LeaderInfo | None:
        """The current leader, or ``None`` if the seat is vacant."""
        kv = await self.client.get(self.key)
        return LeaderInfo.from_kv(kv) if kv else None

    async def observe(self) -> AsyncIterator[LeaderInfo | None]:
        """Yield the current leader (``None``: vacant), then every change of leader or value."""
        last: object = _UNSET
        async with await self.client.watch_key(self.key, snapshot=True) as watch:
            async for item in watch:
                if isinstance(item, WatchResync):
                    current = LeaderInfo.from_kv(item.kvs[0]) if item.kvs else None
                elif item.type is EventType.DELETE:
                    current = None
                else:
                    current = LeaderInfo.from_kv(item.kv)
                marker = (current.create_revision, current.value) if current else None
                if marker != last:
                    last = marker
                    yield current

    # -- internals --------------------------------------------------------------------------------

    async def _live_lease(self) -> Lease:
        """Our lease, kept alive; a new one if the old was lost while we waited."""
        if self._lease is not None and self._keep_alive is not None and not self._keep_alive.lost.is_set():
            return self._lease
        await self._drop_lease()
        lease = await self.client.grant_lease(self.ttl)
        self._lease = lease
        self._keep_alive = self.client.keep_alive(lease, on_lost=self._on_lease_lost).start()
        return lease

    async def _drop_lease(self) -> None:
        keep_alive, lease = self._keep_alive, self._lease
        self._keep_alive = self._lease = None
        if keep_alive is not None:
            await keep_alive.stop()
        if lease is not None and keep_alive is not None and not keep_alive.lost.is_set():
            try:
                await lease.revoke()
            except EtcdError as error:
                log.warning(
                    "could not revoke lease %x (%s); it expires after %ss", lease.id, error, lease.ttl
                )

    async def _do_acquire(self, lease: Lease) -> KeyValue | None:
        """One txn: take the key if vacant. ``None`` if we hold it now, else the current holder."""
        result = await self.client.txn(
            (Compare.absent(self.key),), (Op.put(self.key, self._value, lease),), (Op.get(self.key),)
        )
        if result.succeeded:
            self._leader_revision = result.revision
            return None
        holder = result.kvs(0)[0]
        if holder.lease == lease.id:
            # Our own earlier attempt was applied although its answer was lost.
            self._leader_revision = holder.create_revision
            return None
        return holder

    async def _wait_until_vacant(self, holder: KeyValue) -> None:
        """Return once the key held by ``holder`` is deleted (or gone after a resync)."""
        watch = await self.client.watch_key(self.key, start_revision=holder.mod_revision + 1)
        async with watch:
            async for item in watch:
                if isinstance(item, WatchResync):
                    if not item.kvs:
                        return
                elif item.type is EventType.DELETE:
                    return

    def _begin_term(self) -> None:
        self.lost = asyncio.Event()
        self.loss_reason = None
        log.info("%s leads %r (term revision %s)", self.candidate_id, self.key, self._leader_revision)
        self._monitor = asyncio.create_task(self._monitor_routine(), name=f"etcd-election-{self.key}")

    def _end_term(self) -> None:
        self._leader_revision = None
        monitor, self._monitor = self._monitor, None
        if monitor is not None and monitor is not asyncio.current_task():
            monitor.cancel()

    async def _lose(self, reason: str) -> None:
        if not self.is_leader:
            return
        self._end_term()
        self.loss_reason = reason
        self.lost.set()
        log.warning("%s lost leadership of %r: %s", self.candidate_id, self.key, reason)
        if self._on_lost is None:
            return
        try:
            result = self._on_lost(reason)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_lost callback of election %r failed", self.key)

    async def _on_lease_lost(self, lease: Lease, reason: str) -> None:
        if lease is self._lease:
            await self._lose(f"lease lost: {reason}")

    async def _monitor_routine(self) -> None:
        """While leader: watch our key; its deletion or replacement ends the term."""
        revision = self._leader_revision
        assert revision is not None
        backoff = Backoff(maximum=2.0)
        while self._leader_revision == revision:
            try:
                watch = await self.client.watch_key(self.key, start_revision=revision + 1)
            except EtcdUnavailableError:
                await asyncio.sleep(backoff.next_delay())
                continue
            except EtcdClosedError:
                return  # the client is shutting down; so is this term
            async with watch:
                async for item in watch:
                    if isinstance(item, WatchResync):
                        gone = not item.kvs or item.kvs[0].create_revision != revision
                    else:
                        gone = item.type is EventType.DELETE or item.kv.create_revision != revision
                    if gone:
                        await self._lose("election key deleted or taken over")
                        return
