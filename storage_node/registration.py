"""A storage node's membership: ``brokers/<id>`` in etcd, attached to a lease it keeps alive.

This is ZooKeeper's ephemeral broker node: while the key exists the node is live; when the
process dies its lease expires and the controller marks its partitions offline. The key is
created with one create-if-absent transaction, so a second node with a live id cannot steal
it -- it refuses to start instead. If the lease is lost while the process lives (etcd
unreachable for longer than the TTL), the node registers again with a fresh lease as soon as
etcd answers, as a Kafka broker re-creates its ephemeral node after a session expiry.
"""

from __future__ import annotations

import asyncio
import logging

from services.broker_address import BrokerAddress
from services.cluster_keys import broker_key, cluster_prefix, encode_broker_record
from services.etcd.client import EtcdClient
from services.etcd.connection import tls_from_files
from services.etcd.exceptions import EtcdError
from services.etcd.lease import KeepAlive, Lease
from services.log_limit import RepeatedLog

log = logging.getLogger(__name__)
#: Retry loops against an unreachable etcd log once, then a count (every 0.5 s flooded the log).
_repeats = RepeatedLog(log)


class NodeIdInUseError(RuntimeError):
    """Another live storage node holds this node id."""


class BrokerRegistration:
    """Registers one node and keeps the registration alive until :meth:`deregister`."""

    def __init__(
        self, client: EtcdClient, info: BrokerAddress, ttl: int, *, start_timeout: float = 30.0
    ) -> None:
        self.client = client
        self.info = info
        self.ttl = ttl
        self.start_timeout = start_timeout
        self.lease: Lease | None = None
        self._keep_alive: KeepAlive | None = None
        self._watchdog: asyncio.Task | None = None
        self.registrations = 0
        #: The current registration's create revision (Kafka's broker epoch; the controller's
        #: ``incarnation``), named in a controlled shutdown request; 0 until registered.
        self.broker_epoch = 0

    @classmethod
    def from_config(cls, config, *, grpc_port: int, fetch_port: int) -> BrokerRegistration:
        client = EtcdClient(
            config.etcd_endpoints,
            prefix=cluster_prefix(config.cluster),
            tls=tls_from_files(config.etcd_ca_file, config.etcd_cert_file, config.etcd_key_file),
            timeout=config.etcd_timeout_s,
        )
        info = BrokerAddress(config.node_id, config.host, grpc_port, fetch_port, config.rack)
        return cls(client, info, config.session_timeout_s)

    async def register(self) -> None:
        """Create the key under a fresh lease; retry while etcd is unreachable (up to the timeout).

        Raises NodeIdInUseError when another live node holds the id.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        while True:
            try:
                await self._try_register()
                break
            except EtcdError as exc:
                if loop.time() > deadline:
                    raise
                _repeats.warning("etcd not reachable for registration (%s); retrying", exc)
                await asyncio.sleep(0.5)
        _repeats.ended()
        self._watchdog = asyncio.create_task(self._lease_watchdog_routine(), name="registration-watchdog")

    async def _try_register(self) -> None:
        lease = await self.client.grant_lease(self.ttl)
        key = broker_key(self.info.node_id)
        if not await self.client.create_if_absent(key, encode_broker_record(self.info), lease):
            # A node restarted right after a crash finds its own previous registration, whose
            # lease has not expired yet: wait out one TTL before calling the id taken.
            if not await self._wait_until_free(key, self.ttl + 2):
                await lease.revoke()
                holder = await self.client.get(key)
                detail = holder.value.decode(errors="replace") if holder else "(gone meanwhile)"
                raise NodeIdInUseError(
                    f"node id {self.info.node_id} is already registered by a live node: {detail}; "
                    f"stop that node or choose another --node-id"
                )
            if not await self.client.create_if_absent(key, encode_broker_record(self.info), lease):
                await lease.revoke()
                raise NodeIdInUseError(f"node id {self.info.node_id} was taken by another node meanwhile")
        self.lease = lease
        self._keep_alive = self.client.keep_alive(lease).start()
        self.registrations += 1
        self.broker_epoch = 0
        await self.current_broker_epoch()
        log.info(
            "registered as %s (lease %x, ttl %ds, broker epoch %d)",
            key,
            lease.id,
            self.ttl,
            self.broker_epoch,
        )

    async def current_broker_epoch(self) -> int:
        """The registration's create revision, read from etcd once (0 while it cannot be read:
        the registration itself stands either way)."""
        if self.broker_epoch == 0 and self.lease is not None:
            try:
                registered = await self.client.get(broker_key(self.info.node_id))
            except EtcdError as exc:
                log.warning("could not read this node's broker epoch (%s); asked again when needed", exc)
                return 0
            if registered is not None and registered.lease == self.lease.id:
                self.broker_epoch = registered.create_revision
        return self.broker_epoch

    async def _wait_until_free(self, key: str, timeout: float) -> bool:
        """Poll until ``key`` is gone (True) or ``timeout`` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        log.warning(
            "%s is held (a previous run of this node?); waiting up to %.0fs for it to expire", key, timeout
        )
        while loop.time() < deadline:
            if await self.client.get(key) is None:
                return True
            await asyncio.sleep(0.2)
        return False

    async def _lease_watchdog_routine(self) -> None:
        while True:
            assert self._keep_alive is not None, "the watchdog starts after the first registration"
            reason = await self._keep_alive.wait_lost()
            log.error("registration lease lost (%s); registering again", reason)
            while True:
                try:
                    await self._try_register()
                    break
                except NodeIdInUseError as exc:
                    _repeats.error("%s", exc, key="node id in use")
                    await asyncio.sleep(self.ttl)
                except EtcdError as exc:
                    _repeats.warning("etcd not reachable to re-register (%s); retrying", exc)
                    await asyncio.sleep(0.5)
            _repeats.ended()

    async def deregister(self) -> None:
        """Stop keeping the lease alive and revoke it, so the node leaves at once (not after TTL)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        if self._keep_alive is not None:
            await self._keep_alive.stop()
        if self.lease is not None:
            try:
                await self.lease.revoke()
            except EtcdError as exc:
                log.warning("could not revoke the registration lease (%s); it expires in %ds", exc, self.ttl)
        await self.client.close()
