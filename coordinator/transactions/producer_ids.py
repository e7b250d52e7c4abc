"""Producer ids, handed out from blocks taken from one counter in etcd (Kafka's ProducerIdManager).

``producer_ids`` holds the first id no block has taken yet. The active controller takes a block
of ``block_size`` ids by moving the counter past it with a compare-and-swap on the key's mod
revision, fenced by its controller epoch, and hands the ids out from memory: one etcd write per
block instead of one per producer. Ids are never reused: a block belongs to the term that took it
(a new term takes a new block and the rest of the old one is never handed out), and a claim
whose outcome is unknown (etcd failed mid-write) is simply not used -- the next claim reads the
counter again and starts after it.

Ids start at 1: proto3 turns an unset ``producer_id`` into 0, so a client that forgets the -1 of
"no id" is told its id was never handed out instead of being given someone else's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from coordinator.transactions import keys
from services import errors
from services.etcd.exceptions import EtcdError
from services.etcd.txn import Compare, Op

log = logging.getLogger(__name__)

FIRST_PRODUCER_ID = 1
MAX_PRODUCER_ID = 2**63 - 1
#: Attempts of a block claim that lost its compare-and-swap (only another writer of the counter
#: -- a deposed controller's last write racing ours -- can make it lose).
_CLAIM_ATTEMPTS = 5


@dataclass(slots=True)
class ProducerIdBlock:
    """Ids ``start`` <= id < ``end``; ``next`` is the first not yet handed out."""

    start: int
    end: int
    next: int

    @property
    def exhausted(self) -> bool:
        return self.next >= self.end

    def take(self) -> int:
        if self.exhausted:
            raise AssertionError(f"producer id block [{self.start}, {self.end}) is exhausted")
        producer_id, self.next = self.next, self.next + 1
        return producer_id


def claim_block(stored_next: int, size: int) -> tuple[ProducerIdBlock, int]:
    """The block that starts at the stored counter, and the counter's value after taking it."""
    if size < 1:
        raise ValueError(f"block size must be positive, not {size}")
    start = max(stored_next, FIRST_PRODUCER_ID)
    end = start + size
    if end - 1 > MAX_PRODUCER_ID:
        raise errors.TributaryError(f"producer ids are exhausted (the counter is at {stored_next})")
    return ProducerIdBlock(start, end, start), end


class ProducerIdManager:
    """Producer ids for one controller term."""

    def __init__(self, *, client, controller, block_size: int) -> None:
        self.client = client
        self.controller = controller
        self.block_size = block_size
        self._block: ProducerIdBlock | None = None
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        """A producer id no one has had before."""
        async with self._lock:
            if self._block is None or self._block.exhausted:
                self._block = await self._claim()
            return self._block.take()

    async def ensure_handed_out(self, producer_id: int) -> None:
        """INVALID_PRODUCER_ID_MAPPING for an id no InitProducerId can have answered with (below
        the first id, or at or above the counter / this term's next id)."""
        if self._block is not None:
            known = producer_id < self._block.next
        else:
            known = producer_id < await self._stored_next()
        if producer_id < FIRST_PRODUCER_ID or not known:
            raise errors.InvalidProducerIdMappingError(f"producer id {producer_id} was never handed out")

    async def _claim(self) -> ProducerIdBlock:
        for _ in range(_CLAIM_ATTEMPTS):
            kv = await self._read()
            stored = self._decode(kv.value) if kv is not None else FIRST_PRODUCER_ID
            block, after = claim_block(stored, self.block_size)
            result = await self.controller.fenced_txn(
                [Op.put(keys.PRODUCER_IDS, keys.encode_next_producer_id(after))],
                [Compare.mod_revision(keys.PRODUCER_IDS, kv.mod_revision if kv is not None else 0)],
            )
            if result.succeeded:
                log.info(
                    "took producer ids %d..%d (controller epoch %d)",
                    block.start,
                    block.end - 1,
                    self.controller.epoch,
                )
                return block
        raise errors.CoordinatorNotAvailableError("the producer id counter kept changing underneath; retry")

    async def _stored_next(self) -> int:
        kv = await self._read()
        return self._decode(kv.value) if kv is not None else FIRST_PRODUCER_ID

    async def _read(self):
        try:
            return await self.client.get(keys.PRODUCER_IDS)
        except EtcdError as exc:
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc}") from exc

    @staticmethod
    def _decode(raw: bytes) -> int:
        try:
            return keys.decode_next_producer_id(raw)
        except keys.BadTxnValueError as exc:
            log.error("cannot hand out producer ids: %s", exc)
            raise errors.TributaryError(f"the producer id counter in etcd is unreadable: {exc}") from exc
