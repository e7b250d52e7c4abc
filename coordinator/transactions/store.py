"""The transactional ids of one controller term, in memory and in etcd: entries, locks, fenced writes.

Every change follows one pattern: with the entry's lock held, compute the next metadata (pure,
:mod:`coordinator.transactions.state`), write it with a compare-and-swap on the key's mod
revision inside a transaction fenced by the controller epoch
(:meth:`~coordinator.controller.Controller.fenced_txn`), and only then keep it -- so memory never
runs ahead of etcd. A write whose outcome is unknown (etcd unreachable mid-call) marks the entry
stale: it is read back from etcd before its next operation.

The active controller is the only writer of ``transactions/``, so what it holds in memory is what
etcd holds. One event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from coordinator.groups.store import TXN_OPS
from coordinator.transactions import keys
from coordinator.transactions.model import TxnMetadata, TxnState
from coordinator.transactions.offload import off_loop_if_large
from services import errors
from services.etcd.exceptions import EtcdError
from services.etcd.txn import Compare, Op

log = logging.getLogger(__name__)


@dataclass
class TxnEntry:
    """One transactional id: its metadata (None until its first InitProducerId is written), the
    mod revision of its key (0: absent), the lock over its changes."""

    transactional_id: str
    meta: TxnMetadata | None = None
    mod_revision: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: A write failed: memory may differ from etcd, reload before the next operation.
    stale: bool = False
    #: Expired and deleted: operations that waited for its lock start over.
    removed: bool = False
    #: The task writing the markers of its PREPARE_* transaction and completing it.
    completion: asyncio.Task | None = None

    @property
    def key(self) -> str:
        return keys.transaction_key(self.transactional_id)

    def guard(self) -> Compare:
        return Compare.mod_revision(self.key, self.mod_revision)


class TxnStore:
    """Every transactional id of the term (see the module docstring)."""

    def __init__(self, *, client, controller, load_wait_s: float) -> None:
        self.client = client
        self.controller = controller
        self.load_wait_s = load_wait_s
        self.entries: dict[str, TxnEntry] = {}
        #: Ids with an ONGOING transaction: what the timeout check looks at.
        self.ongoing: set[str] = set()
        #: Producer id -> its transactional id (partition leaders verify by producer id).
        self.by_producer: dict[int, str] = {}
        self.loaded = asyncio.Event()

    # ---- loading ----------------------------------------------------------------------------------

    async def load(self) -> None:
        """Read every transactional id from etcd (decoded in a worker thread)."""
        kvs, revision = await self.client.get_prefix(keys.TRANSACTIONS)
        loaded, problems = await asyncio.to_thread(keys.load_transactions, kvs)
        for problem in problems:
            log.error("a transactional id with a bad value is treated as new: %s", problem)
        self.entries = {}
        self.ongoing = set()
        self.by_producer = {}
        for transactional_id, (meta, mod_revision) in loaded.items():
            entry = self.entries[transactional_id] = TxnEntry(transactional_id, mod_revision=mod_revision)
            self._keep(entry, meta)
        self.loaded.set()
        log.info(
            "loaded %d transactional ids (%d open, %d being completed) at etcd revision %d",
            len(self.entries),
            len(self.ongoing),
            len(self.preparing()),
            revision,
        )

    async def ready(self) -> None:
        """Wait (bounded) for the load; COORDINATOR_NOT_AVAILABLE if it takes too long."""
        if self.loaded.is_set():
            return
        try:
            async with asyncio.timeout(self.load_wait_s):
                await self.loaded.wait()
        except TimeoutError:
            raise errors.CoordinatorNotAvailableError("transactions are still being loaded") from None

    def preparing(self) -> list[TxnEntry]:
        """Entries whose transaction is decided but not complete."""
        return [e for e in self.entries.values() if e.meta is not None and e.meta.state.preparing]

    # ---- entries and locks ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def locked(self, transactional_id: str, *, create: bool) -> AsyncIterator[TxnEntry]:
        """The id's entry with its lock held -- created if ``create`` (InitProducerId), else
        INVALID_PRODUCER_ID_MAPPING for an id never initialised -- reloaded first if stale."""
        while True:
            entry = self.entries.get(transactional_id)
            if entry is None:
                if not create:
                    raise errors.InvalidProducerIdMappingError(
                        f"transactional id {transactional_id!r} is unknown; call InitProducerId"
                    )
                entry = self.entries[transactional_id] = TxnEntry(transactional_id)
            async with entry.lock:
                if entry.removed:
                    continue  # expired while we waited: start over with the current entry
                try:
                    if entry.stale:
                        await self.reload(entry)
                    yield entry
                finally:
                    if entry.meta is None and entry.mod_revision == 0 and not entry.stale:
                        self._forget(entry)  # a first InitProducerId that wrote nothing
                return

    def _forget(self, entry: TxnEntry) -> None:
        entry.removed = True
        self.ongoing.discard(entry.transactional_id)
        self._unindex(entry)
        if self.entries.get(entry.transactional_id) is entry:
            del self.entries[entry.transactional_id]

    def _keep(self, entry: TxnEntry, meta: TxnMetadata | None) -> None:
        self._unindex(entry)
        entry.meta = meta
        if meta is not None:
            self.by_producer[meta.producer_id] = entry.transactional_id
        if meta is not None and meta.state is TxnState.ONGOING:
            self.ongoing.add(entry.transactional_id)
        else:
            self.ongoing.discard(entry.transactional_id)

    def _unindex(self, entry: TxnEntry) -> None:
        old = entry.meta
        if old is not None and self.by_producer.get(old.producer_id) == entry.transactional_id:
            del self.by_producer[old.producer_id]

    def for_producer(self, producer_id: int) -> TxnMetadata | None:
        """The metadata of the transactional id whose current producer id this is, if any."""
        transactional_id = self.by_producer.get(producer_id)
        entry = self.entries.get(transactional_id) if transactional_id is not None else None
        return entry.meta if entry is not None else None

    # ---- writes ---------------------------------------------------------------------------------------

    async def write(self, entry: TxnEntry, meta: TxnMetadata | None, ops: Sequence[Op] = ()) -> None:
        """Write ``ops`` and then ``meta`` as the id's value (None: only ``ops``), in fenced
        transactions of at most :data:`~coordinator.groups.store.TXN_OPS` operations, each
        guarded by the key's mod revision -- so when everything fits one transaction it is all or
        nothing -- and keep ``meta`` once written. The caller holds the entry's lock."""
        everything = list(ops)
        if meta is not None:
            value = await off_loop_if_large(meta.size, keys.encode_txn, meta)
            if len(value) > keys.MAX_TXN_VALUE_BYTES:
                raise errors.PolicyViolationError(
                    f"transactional id {entry.transactional_id!r}: the transaction would take "
                    f"{len(value)} bytes in etcd, more than {keys.MAX_TXN_VALUE_BYTES} "
                    "(too many partitions or staged offsets)"
                )
            everything.append(Op.put(entry.key, value))
        revision = entry.mod_revision
        try:
            for start in range(0, len(everything), TXN_OPS):
                result = await self.controller.fenced_txn(
                    everything[start : start + TXN_OPS], [entry.guard()]
                )
                if not result.succeeded:
                    raise errors.CoordinatorNotAvailableError(
                        f"transactional id {entry.transactional_id!r} changed underneath; retry"
                    )
                revision = result.revision
        except BaseException:
            entry.stale = True
            raise
        if meta is not None:
            entry.mod_revision = revision
            self._keep(entry, meta)

    async def delete(self, entry: TxnEntry) -> bool:
        """Delete the id's key if it is still what this entry last wrote; whether it was deleted."""
        try:
            result = await self.controller.fenced_txn([Op.delete(entry.key)], [entry.guard()])
        except BaseException:
            entry.stale = True
            raise
        if result.succeeded:
            self._forget(entry)
        else:
            entry.stale = True
        return result.succeeded

    async def reload(self, entry: TxnEntry) -> None:
        """Replace the entry with etcd's value (after a write whose outcome is unknown)."""
        try:
            kv = await self.client.get(entry.key)
        except EtcdError as exc:
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc}") from exc
        problems: list[str] = []
        meta = (
            await off_loop_if_large(len(kv.value) // 32, keys.decoded_or_none, kv, problems)
            if kv is not None
            else None
        )
        for problem in problems:
            log.error("a transactional id with a bad value is treated as new: %s", problem)
        entry.mod_revision = kv.mod_revision if kv is not None else 0
        self._keep(entry, meta)
        entry.stale = False
        log.info("transactional id %s reloaded from etcd", entry.transactional_id)
