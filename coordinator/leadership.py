"""Controller election: campaign for the seat, run a term while holding it, step down, repeat.

Any number of coordinators run :meth:`Leadership.campaign_routine`; etcd makes exactly one the
active controller (``services.etcd.election.Election``: a txn that creates the ``controller``
key under the candidate's lease only if it is absent). The winner then

1. bumps the persistent ``controller_epoch`` counter (guarded by still holding the seat),
2. proclaims ``{coordinator_id, address, epoch}`` in the ``controller`` key, so standbys can
   name and forward to it,
3. waits until its own cache shows that epoch, and runs a :class:`~coordinator.controller.Controller`
   (its reconcile routine), a :class:`~coordinator.groups.manager.GroupManager` (consumer
   groups) and a :class:`~coordinator.transactions.manager.TransactionManager` (producer ids and
   transactions), both loaded from etcd at the start of every term, until the term ends.

A term ends when the election lease is lost (etcd said it expired, or no keep-alive succeeded
within the TTL -- e.g. after a SIGSTOP or an etcd outage), when the election key is taken over,
or when the controller finds its epoch stale on a write. The coordinator then resigns (deleting
the key if still its own) and campaigns again as a standby. Standbys wait on a watch of the key,
so a crashed controller is replaced as soon as etcd expires its lease: within the TTL plus etcd's
expiry check interval (0.5 s).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid

from coordinator import keys
from coordinator.controller import Controller, ControllerSettings
from coordinator.groups.manager import GroupManager, GroupSettings
from coordinator.metadata import MetadataCache
from coordinator.model import ControllerInfo, CoordinatorInfo
from coordinator.storage_client import StorageNodes
from coordinator.transactions.manager import TransactionManager, TransactionSettings
from services.etcd.connection import Backoff
from services.etcd.election import Election
from services.etcd.exceptions import EtcdError, NotLeaderError

log = logging.getLogger(__name__)


class Leadership:
    """This coordinator's part in the controller election, and its controller while it leads."""

    def __init__(
        self,
        *,
        client,
        cache: MetadataCache,
        storage: StorageNodes,
        identity: CoordinatorInfo,
        ttl: int,
        settings: ControllerSettings = ControllerSettings(),
        group_settings: GroupSettings = GroupSettings(),
        transaction_settings: TransactionSettings | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.cache = cache
        self.storage = storage
        self.identity = identity
        self.ttl = ttl
        self.settings = settings
        self.group_settings = group_settings
        self.transaction_settings = transaction_settings or TransactionSettings()
        self._rng = rng
        #: The controller of the current term, while this coordinator is the active one.
        self.controller: Controller | None = None
        #: The consumer groups of the current term, while this coordinator is the active one.
        self.groups: GroupManager | None = None
        #: The transaction coordinator of the current term, while this coordinator is the active one.
        self.transactions: TransactionManager | None = None
        #: Unclean leader elections made by this coordinator's terms (records may have been lost).
        self.unclean_elections = 0
        self._election: Election | None = None

    @property
    def is_active(self) -> bool:
        return self.controller is not None and not self.controller.deposed.is_set()

    async def campaign_routine(self) -> None:
        """Campaign, lead, step down, campaign again -- until cancelled (then resign)."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        try:
            while True:
                try:
                    await self._do_term()
                    backoff.reset()
                except (EtcdError, NotLeaderError) as exc:
                    log.warning("controller term could not start or ended abruptly: %s", exc)
                    await asyncio.sleep(backoff.next_delay())
        finally:
            await self._resign()

    async def _do_term(self) -> None:
        election = Election(
            self.client,
            keys.CONTROLLER,
            self.identity.coordinator_id,
            self.ttl,
            value=self._controller_value(0),
        )
        self._election = election
        try:
            await election.campaign()
            epoch = await election.increment_epoch(keys.CONTROLLER_EPOCH)
            await election.proclaim(self._controller_value(epoch))
            await self._ensure_cluster_id(election)
            log.info("%s is the active controller, epoch %d", self.identity.coordinator_id, epoch)
            await self._serve_term(election, epoch)
        finally:
            await self._resign()

    async def _serve_term(self, election: Election, epoch: int) -> None:
        controller = Controller(
            client=self.client,
            cache=self.cache,
            storage=self.storage,
            epoch=epoch,
            election_guard=election.guard,
            settings=self.settings,
            rng=self._rng,
            on_unclean_election=self._count_unclean_election,
        )
        seen = await self.cache.wait_for(
            lambda s: s.controller is not None and s.controller.epoch == epoch, self.settings.admin_wait_s
        )
        if not seen:
            raise NotLeaderError(f"the cache did not show controller epoch {epoch} in time")
        groups = GroupManager(
            client=self.client,
            cache=self.cache,
            storage=self.storage,
            controller=controller,
            settings=self.group_settings,
        )
        transactions = TransactionManager(
            client=self.client,
            cache=self.cache,
            storage=self.storage,
            controller=controller,
            groups=groups,
            settings=self.transaction_settings,
        )
        self.controller, self.groups, self.transactions = controller, groups, transactions
        reconcile = asyncio.create_task(controller.reconcile_routine(), name="controller-reconcile")
        group_routine = asyncio.create_task(groups.run(), name="consumer-groups")
        transaction_routine = asyncio.create_task(transactions.run(), name="transactions")
        lost = asyncio.create_task(election.lost.wait(), name="controller-lease")
        deposed = asyncio.create_task(controller.deposed.wait(), name="controller-deposed")
        tasks = (reconcile, group_routine, transaction_routine, lost, deposed)
        try:
            await asyncio.wait({reconcile, lost, deposed}, return_when=asyncio.FIRST_COMPLETED)
            controller.depose(election.loss_reason or controller.deposed_reason or "term ended")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _count_unclean_election(self) -> None:
        self.unclean_elections += 1

    async def _resign(self) -> None:
        controller, self.controller, self.groups, self.transactions = self.controller, None, None, None
        if controller is not None:
            controller.depose("resigning")
        election, self._election = self._election, None
        if election is not None:
            await election.resign()

    def _controller_value(self, epoch: int) -> bytes:
        info = ControllerInfo(self.identity.coordinator_id, self.identity.address, epoch)
        return keys.encode_controller(info)

    async def _ensure_cluster_id(self, election: Election) -> None:
        """The first controller of a cluster names it (a uuid, kept forever)."""
        if self.cache.state.cluster_id:
            return
        await self.client.create_if_absent(keys.CLUSTER_ID, uuid.uuid4().hex, guard=[election.guard()])
