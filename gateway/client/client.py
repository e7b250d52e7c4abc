"""What every client shares: the gateway connections, the metadata cache, and metadata lookups.

``GatewayClient`` is to this SDK what ``AIOKafkaClient`` is to aiokafka: producers, consumers and
the admin client each own one and never touch gRPC directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.client.channel import GatewayPool
from gateway.client.credentials import TokenSource
from gateway.client.errors import RequestTimedOutError, TributaryError, UnknownTopicOrPartitionError
from gateway.client.metadata import MetadataCache
from gateway.client.servers import resolve_servers
from gateway.client.structs import OffsetAndTimestamp, TopicDescription, TopicPartition
from gateway.client.throttle import Throttles
from services.clock import SYSTEM_CLOCK, Clock
from services.proto import pb
from services.serde import error_from_proto
from services.tls import ClientTls, client_tls_problem

log = logging.getLogger(__name__)


class GatewayClient:
    """Connections plus cached metadata, on one event loop.

    ``servers`` follows :func:`~gateway.client.servers.resolve_servers` (explicit, then
    ``$TRIBUTARY_GATEWAY``, then the local cluster's ``cluster.json``).
    """

    def __init__(
        self,
        servers: str | Sequence[str] | None = None,
        *,
        request_timeout_ms: int = 30_000,
        metadata_max_age_ms: int = 300_000,
        retry_backoff_ms: int = 100,
        clock: Clock = SYSTEM_CLOCK,
        client_id: str = "",
        tls: ClientTls | None = None,
        token_source: TokenSource | None = None,
    ) -> None:
        self.addresses = resolve_servers(servers)
        #: TLS to the gateways (gRPC and the raw data listener); None: plaintext.
        self.tls = tls
        #: The bearer token presented to the gateways (SASL_SSL), else None.
        self.token_source = token_source
        if token_source is not None and tls is None:
            raise ValueError("a bearer token is only sent over TLS (security_protocol='SASL_SSL')")
        #: Kafka's client.id: sent in every call's metadata (``tributary-client-id``).
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.clock = clock
        self.metadata = MetadataCache(max_age_ms=metadata_max_age_ms)
        self._pool: GatewayPool | None = None
        #: How long gateways asked this client to hold its produce and fetch requests (client
        #: quotas, ``throttle_time_ms``), per gateway address: see ``gateway/client/throttle.py``.
        self.produce_throttles = Throttles("produce", monotonic=clock.monotonic)
        self.fetch_throttles = Throttles("fetch", monotonic=clock.monotonic)

    @property
    def pool(self) -> GatewayPool:
        # Channels are created lazily, on the loop that first uses them (gRPC asyncio channels
        # belong to the loop they were created on).
        if self._pool is None:
            self._pool = GatewayPool(
                self.addresses,
                monotonic=self.clock.monotonic,
                client_id=self.client_id,
                tls=self.tls,
                token_source=self.token_source,
            )
        return self._pool

    async def call(self, method: str, request, *, timeout_ms: int | None = None, failover: bool = True):
        """One ``Gateway`` RPC with the client's request timeout; errors are typed."""
        timeout = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000.0
        return await self.pool.call(method, request, timeout=timeout, failover=failover)

    async def call_with_retry(self, method: str, request, *, max_wait_ms: int | None = None):
        """``call``, retrying retriable errors with backoff until ``max_wait_ms`` has passed."""
        deadline = self.clock.monotonic() + (max_wait_ms or self.request_timeout_ms) / 1000.0
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.call(method, request)
            except TributaryError as exc:
                delay = min(1.0, self.retry_backoff_ms / 1000.0 * 2 ** (attempt - 1))
                if not exc.retriable or self.clock.monotonic() + delay > deadline:
                    raise
                log.debug("%s failed (%s); retrying in %.2fs", method, exc, delay)
                await asyncio.sleep(delay)

    async def refresh_metadata(self, topics: Sequence[str] = (), *, max_wait_ms: int | None = None):
        """Fetch metadata for ``topics`` (all topics when empty) into the cache; returns the response."""
        response = await self.call_with_retry(
            "GetMetadata", pb.GetMetadataRequest(topics=list(topics)), max_wait_ms=max_wait_ms
        )
        self.metadata.update(response, self.clock.time_ms())
        for topic in response.topics:  # a topic this client may not describe: no use waiting
            if topic.HasField("error") and topic.error.reason == "TOPIC_AUTHORIZATION_FAILED":
                refusal = error_from_proto(topic.error)
                if refusal is not None:
                    raise refusal
        return response

    async def ensure_topic(self, topic: str, *, max_wait_ms: int) -> TopicDescription:
        """The topic's metadata, from the cache when fresh, else fetched.

        An unknown topic is asked for again (with backoff) until ``max_wait_ms``, as Kafka's
        producer waits for a topic that may be being created, then raises
        :class:`UnknownTopicOrPartitionError`.
        """
        cached = self.metadata.topic(topic)
        if cached is not None and not self.metadata.is_stale(topic, self.clock.time_ms()):
            return cached
        deadline = self.clock.monotonic() + max_wait_ms / 1000.0
        delay = self.retry_backoff_ms / 1000.0
        while True:
            remaining_ms = int((deadline - self.clock.monotonic()) * 1000)
            try:
                await self.refresh_metadata([topic], max_wait_ms=max(remaining_ms, 1))
            except UnknownTopicOrPartitionError:
                pass
            except RequestTimedOutError as exc:
                raise RequestTimedOutError(
                    f"no metadata for topic {topic!r} within {max_wait_ms} ms: {exc}"
                ) from exc
            description = self.metadata.topic(topic)
            if description is not None:
                return description
            if self.clock.monotonic() + delay > deadline:
                waited = f" after {max_wait_ms} ms" if max_wait_ms else ""
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} not present in the cluster metadata{waited}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def offset_spec(spec) -> pb.OffsetSpec:
    """``"earliest"``, ``"latest"`` or a timestamp in ms, as a ``pb.OffsetSpec``."""
    if spec == "earliest":
        return pb.OffsetSpec(earliest=True)
    if spec == "latest":
        return pb.OffsetSpec(latest=True)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return pb.OffsetSpec(timestamp=spec)
    raise ValueError(f"offset spec must be 'earliest', 'latest' or a timestamp in ms, not {spec!r}")


async def list_offsets(client: GatewayClient, specs: dict, *, read_committed: bool = False) -> dict:
    """One ListOffsets call: ``{tp: spec}`` -> ``{tp: OffsetAndTimestamp | TributaryError}``.

    A timestamp with no record at or after it gives ``OffsetAndTimestamp(-1, -1)``. With
    ``read_committed``, "latest" is the last stable offset (Kafka's isolation-level lookup).
    """
    if not specs:
        return {}
    request = pb.ListOffsetsRequest(
        partitions=[
            pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, spec=offset_spec(spec))
            for tp, spec in specs.items()
        ],
        isolation_level=(
            pb.ISOLATION_LEVEL_READ_COMMITTED if read_committed else pb.ISOLATION_LEVEL_UNSPECIFIED
        ),
    )
    response = await client.call_with_retry("ListOffsets", request)
    results: dict = {}
    for item in response.partitions:
        tp = TopicPartition(item.topic, item.partition)
        error = error_from_proto(item.error) if item.HasField("error") else None
        results[tp] = error if error is not None else OffsetAndTimestamp(item.offset, item.timestamp)
    for tp in specs:
        results.setdefault(tp, UnknownTopicOrPartitionError(f"no ListOffsets answer for {tp}"))
    return results


#: Kafka's security.protocol values a client may use: SASL_SSL is TLS plus a bearer token
#: (``gateway/client/credentials.py``). SASL_PLAINTEXT is refused: a token sent in the clear
#: can be replayed by anyone on the path.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


def client_tls(
    security_protocol: str, ssl_cafile: str | None, ssl_certfile: str | None, ssl_keyfile: str | None
) -> ClientTls | None:
    """The TLS a client's settings ask for (Kafka's names): None for ``PLAINTEXT``; ValueError
    for settings that contradict each other or name missing files (never ignored)."""
    protocol = security_protocol.upper()
    if protocol == "SASL_PLAINTEXT":
        raise ValueError(
            "security_protocol='SASL_PLAINTEXT' is not supported: a bearer token sent without TLS "
            "can be replayed by anyone who sees it; use 'SASL_SSL'"
        )
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"security_protocol must be one of {SECURITY_PROTOCOLS}, not {security_protocol!r}")
    given = [
        name
        for name, value in (
            ("ssl_cafile", ssl_cafile),
            ("ssl_certfile", ssl_certfile),
            ("ssl_keyfile", ssl_keyfile),
        )
        if value
    ]
    if protocol == "PLAINTEXT":
        if given:
            raise ValueError(f"{', '.join(given)} need security_protocol='SSL' (it is PLAINTEXT)")
        return None
    tls = ClientTls(
        Path(ssl_cafile) if ssl_cafile else None,
        Path(ssl_certfile) if ssl_certfile else None,
        Path(ssl_keyfile) if ssl_keyfile else None,
    )
    problem = client_tls_problem(tls)
    if problem is not None:
        raise ValueError(problem)
    return tls
