"""Where requests go: the watch-fed metadata cache, leader lookup, and clients per storage node.

* :class:`MetadataWatch` keeps the latest :class:`~gateway.server.cluster_snapshot.ClusterSnapshot`. Its
  ``_watch_routine`` follows ``Coordinator.WatchMetadata`` on one coordinator, failing over to the
  next when the stream breaks; against a coordinator without WatchMetadata (UNIMPLEMENTED) it
  polls GetMetadata instead (every ``poll_interval_s``), trying the watch again every minute.
  :meth:`MetadataWatch.refresh` fetches a fresh snapshot at once (coalesced: concurrent callers
  share one call) -- what request handlers do after a retriable ``invalid_metadata`` error,
  because the watch may lag behind what a storage node just said, and for a topic the cache
  does not know (it may have been created a moment ago).
* :class:`NodeClients` holds one gRPC channel, one fetch-port client and one pipelined append
  connection (``node_appends.py``) per storage node *address*: a node restarted on new ports
  gets new clients, and clients of addresses that left the metadata are closed.
* :class:`Router` puts both behind the lookups the handlers need.

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from gateway.server.cluster_snapshot import ClusterSnapshot, PartialTopicError, TopicRoute
from gateway.server.coordinators import CHANNEL_OPTIONS, CoordinatorPool
from gateway.server.node_appends import NodeAppends
from services import errors
from services.broker_address import BrokerAddress
from services.fetchport.client import FetchClient
from services.proto import pb, storage_grpc
from services.tls import ChannelRotation, ClientTls, ReloadingClientContext, aio_channel, retire_channels

log = logging.getLogger(__name__)

_WATCH_BACKOFF_MAX_S = 2.0
#: In poll mode, try the watch again this often (a coordinator upgraded in place gains it).
_WATCH_RETRY_S = 60.0


class MetadataGapError(Exception):
    """A metadata delta that does not follow the snapshot held: the watch starts over."""


class MetadataWatch:
    """The latest snapshot, kept current by a watch, refreshable on demand."""

    def __init__(
        self, coordinators: CoordinatorPool, *, poll_interval_s: float = 1.0, call_timeout_s: float = 5.0
    ) -> None:
        self._coordinators = coordinators
        self._poll_interval_s = poll_interval_s
        self._call_timeout_s = call_timeout_s
        self._snapshot = ClusterSnapshot.empty()
        self._changed = asyncio.Event()
        self._refreshing: asyncio.Task | None = None
        self._refreshes_started = 0
        self._refreshes_finished = 0
        self._task: asyncio.Task | None = None
        #: "watch" or "poll": how the cache is fed (poll = the coordinator lacks WatchMetadata).
        self.mode = "watch"
        self._polled = False

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch_routine(), name="metadata-watch")

    async def stop(self) -> None:
        for task in (self._task, self._refreshing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def apply(self, response) -> bool:
        """Install ``response`` if it is not older than the current snapshot; True if installed.

        A delta (WatchMetadata's ``is_delta``) is applied to the current snapshot; one whose base
        is newer than that snapshot cannot be and raises :class:`MetadataGapError`."""
        current = self._snapshot
        if response.revision < current.revision:
            return False
        if response.is_delta:
            if current.revision < response.base_revision:
                raise MetadataGapError(
                    f"metadata delta from revision {response.base_revision} does not apply to "
                    f"revision {current.revision}"
                )
            try:
                self._snapshot = current.with_delta(response)
            except PartialTopicError as exc:
                raise MetadataGapError(str(exc)) from exc
        else:
            self._snapshot = ClusterSnapshot.from_proto(response)
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the next installed snapshot; True if one came."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def refresh(self) -> ClusterSnapshot:
        """A snapshot from a GetMetadata call that started after this call did.

        Concurrent callers share calls: while one is in flight, everyone who arrives meanwhile
        waits for the single next one, so a burst of errors costs at most two calls. A failed call
        leaves the current snapshot in place (the failure is logged, the caller retries later).
        """
        target = self._refreshes_started + 1
        while self._refreshes_finished < target:
            if self._refreshing is None:
                self._refreshes_started += 1
                self._refreshing = asyncio.create_task(self._do_refresh(self._refreshes_started))
            try:
                await asyncio.shield(self._refreshing)
            except errors.TributaryError as exc:
                log.info("metadata refresh failed: %s", exc)
        return self._snapshot

    async def _do_refresh(self, sequence: int) -> None:
        try:
            response = await self._coordinators.call(
                "GetMetadata", pb.GetMetadataRequest(), timeout=self._call_timeout_s
            )
            self.apply(response)
        finally:
            self._refreshes_finished = max(self._refreshes_finished, sequence)
            self._refreshing = None

    async def _watch_routine(self) -> None:
        backoff = 0.05
        while True:
            address = self._coordinators.current_address
            try:
                await self._do_watch(address)
                backoff = 0.05  # the stream ended cleanly (coordinator shutting down)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.log(
                        logging.WARNING if self.mode == "watch" and not self._polled else logging.DEBUG,
                        "coordinator %s does not implement WatchMetadata; polling GetMetadata every %.1fs",
                        address,
                        self._poll_interval_s,
                    )
                    self._polled = True
                    self.mode = "poll"
                    await self._poll_routine(_WATCH_RETRY_S)
                    self.mode = "watch"
                    continue
                log.info(
                    "metadata watch on %s broke (%s: %s); failing over",
                    address,
                    exc.code().name,
                    exc.details(),
                )
            self._coordinators.rotate()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _WATCH_BACKOFF_MAX_S)

    async def _do_watch(self, address: str) -> None:
        """Follow one coordinator's WatchMetadata: the whole metadata, then deltas."""
        stream = self._coordinators.stub(address).WatchMetadata(
            pb.WatchMetadataRequest(after_revision=0, accept_deltas=True, accept_partition_deltas=True)
        )
        try:
            async for response in stream:
                if self.apply(response):
                    log.debug("metadata revision %d from %s", response.revision, address)
        except MetadataGapError as exc:
            stream.cancel()
            log.warning("%s; watching %s again", exc, address)

    async def _poll_routine(self, duration_s: float) -> None:
        end = asyncio.get_running_loop().time() + duration_s
        while asyncio.get_running_loop().time() < end:
            await self.refresh()
            await asyncio.sleep(self._poll_interval_s)

    async def topic(self, name: str) -> TopicRoute:
        """The topic's route; refreshes once before answering UNKNOWN_TOPIC_OR_PARTITION."""
        route = self._snapshot.topics.get(name)
        if route is None:
            route = (await self.refresh()).ensure_topic(name)
        return route


class NodeClients:
    """A gRPC channel and a fetch-port client per storage node address."""

    def __init__(
        self,
        *,
        fetch_connections: int = 64,
        interceptors: Callable[[str], list] | None = None,
        data_port_appends: bool = True,
        tracer=None,
        tls: ClientTls | None = None,
    ) -> None:
        self._fetch_connections = fetch_connections
        #: Mutual TLS to the nodes' gRPC and fetch/data ports (the gateway's member certificate).
        self._tls = tls
        self._ssl = ReloadingClientContext(tls) if tls is not None else None
        self._rotation = ChannelRotation(tls)
        #: Appends go over the nodes' data ports (``node_appends.py``); False = gRPC only.
        self._data_port_appends = data_port_appends
        self._appends: dict[tuple[str, int], NodeAppends] = {}
        #: The gateway's tracer when telemetry is on (spans of the data-port appends), else None.
        self._tracer = tracer
        #: target -> client interceptors for its channel (telemetry), or None.
        self._interceptors = interceptors
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, storage_grpc.StorageNodeStub] = {}
        self._fetchers: dict[tuple[str, int], FetchClient] = {}

    def storage(self, node: BrokerAddress) -> storage_grpc.StorageNodeStub:
        # One stub per channel: building one creates a callable per RPC of the service, which
        # per call was a tenth of the gateway's time producing to thousands of partitions.
        if self._rotation.rotated():  # new channels present the new certificate
            retire_channels(self._channels.values())
            self._channels, self._stubs = {}, {}
        stub = self._stubs.get(node.grpc_target)
        if stub is not None:
            return stub
        channel = self._channels.get(node.grpc_target)
        if channel is None:
            target = node.grpc_target
            interceptors = self._interceptors(target) if self._interceptors is not None else None
            channel = aio_channel(
                target, self._tls, options=CHANNEL_OPTIONS, interceptors=interceptors or None
            )
            self._channels[target] = channel
        stub = self._stubs[node.grpc_target] = storage_grpc.StorageNodeStub(channel)
        return stub

    def fetcher(self, node: BrokerAddress) -> FetchClient:
        key = (node.host, node.fetch_port)
        client = self._fetchers.get(key)
        if client is None:
            client = FetchClient(
                node.host, node.fetch_port, max_connections=self._fetch_connections, ssl=self._ssl
            )
            self._fetchers[key] = client
        return client

    def appends(self, node: BrokerAddress) -> NodeAppends | None:
        """The node's pipelined append connection, or None (gRPC only: switched off, or the node
        advertises no data port)."""
        if not self._data_port_appends or not node.fetch_port:
            return None
        key = (node.host, node.fetch_port)
        appends = self._appends.get(key)
        if appends is None:
            appends = self._appends[key] = NodeAppends(
                node.host, node.fetch_port, tracer=self._tracer, tls=self._ssl
            )
        return appends

    async def prune(self, snapshot: ClusterSnapshot) -> None:
        """Close clients of addresses no live node has any more (nodes restarted on new ports)."""
        targets = {n.grpc_target for n in snapshot.nodes.values()}
        fetch_keys = {(n.host, n.fetch_port) for n in snapshot.nodes.values()}
        stale_channels = [self._channels.pop(t) for t in list(self._channels) if t not in targets]
        for target in [t for t in self._stubs if t not in targets]:
            del self._stubs[target]
        stale_fetchers = [self._fetchers.pop(k) for k in list(self._fetchers) if k not in fetch_keys]
        stale_appends = [self._appends.pop(k) for k in list(self._appends) if k not in fetch_keys]
        await asyncio.gather(*(a.close() for a in stale_appends), return_exceptions=True)
        await asyncio.gather(*(c.close(grace=5.0) for c in stale_channels), return_exceptions=True)
        await asyncio.gather(*(f.close() for f in stale_fetchers), return_exceptions=True)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()), return_exceptions=True)
        await asyncio.gather(*(f.close() for f in self._fetchers.values()), return_exceptions=True)
        await asyncio.gather(*(a.close() for a in self._appends.values()), return_exceptions=True)
        self._appends.clear()
        self._stubs.clear()
        self._channels.clear()
        self._fetchers.clear()


class Router:
    """Metadata cache + node clients: what produce, fetch and offsets handlers are given."""

    def __init__(self, cache: MetadataWatch, clients: NodeClients) -> None:
        self.cache = cache
        self.clients = clients
        self._pruner: asyncio.Task | None = None

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self.cache.snapshot

    async def topic(self, name: str) -> TopicRoute:
        return await self.cache.topic(name)

    async def refresh(self) -> ClusterSnapshot:
        return await self.cache.refresh()

    def start(self) -> None:
        self.cache.start()
        self._pruner = asyncio.create_task(self._prune_routine(), name="node-client-pruner")

    async def _prune_routine(self) -> None:
        while True:
            await self.cache.wait_for_change(timeout=3600)
            snapshot = self.cache.snapshot
            if snapshot.revision >= 0:
                await self.clients.prune(snapshot)

    async def close(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.gather(self._pruner, return_exceptions=True)
        await self.cache.stop()
        await self.clients.close()
