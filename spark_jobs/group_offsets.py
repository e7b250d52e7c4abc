"""A consumer group's committed offsets, committed standalone through the Gateway's raw stubs.

The SDK's group consumer does not exist yet, so the loader commits as a *standalone* consumer:
``CommitOffsets`` with an empty ``member_id`` and ``generation_id`` -1 (allowed while the group
has no active members), and reads back with ``FetchCommittedOffsets``. The offsets follow
Kafka's convention: the next offset to consume.

Best-effort by design: the loader's own ``_offsets`` manifests are the source of truth for
exactly-once, and the group's offsets only mirror them (for lag monitoring and for a new
output starting where the group is). When the cluster does not serve group offsets (UNIMPLEMENTED,
or an error), :meth:`GroupOffsets.commit` logs one clear line and returns False.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import grpc

from gateway.client import TopicPartition
from gateway.client.servers import split_addresses
from services.errors import error_from_rpc
from services.proto import gateway_grpc, pb

log = logging.getLogger("spark_jobs.group_offsets")

STANDALONE_MEMBER = ""
STANDALONE_GENERATION = -1


class GroupOffsetsUnavailable(RuntimeError):
    """The cluster could not store or return the group's offsets."""


class GroupOffsets:
    """Fetch and commit one group's offsets; use as a context manager."""

    def __init__(self, servers: str, group_id: str, *, timeout_s: float = 10.0) -> None:
        self.group_id = group_id
        self.timeout_s = timeout_s
        self._addresses = split_addresses(servers)
        self._channels: dict[str, grpc.Channel] = {}

    def __enter__(self) -> GroupOffsets:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def fetch(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int] | None:
        """Committed offsets of ``tps`` (partitions without one are left out); None if unavailable."""
        request = pb.FetchCommittedOffsetsRequest(
            group_id=self.group_id, partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in tps]
        )
        try:
            response = self._call("FetchCommittedOffsets", request)
        except GroupOffsetsUnavailable as exc:
            log.warning(
                "group %s: committed offsets not read (%s); starting from the output's manifests "
                "or the earliest offsets",
                self.group_id,
                exc,
            )
            return None
        return {
            TopicPartition(o.topic, o.partition): o.offset
            for o in response.offsets
            if o.offset >= 0 and not (o.HasField("error") and o.error.reason)
        }

    def commit(self, offsets: Mapping[TopicPartition, int], metadata: str = "") -> bool:
        """Commit ``offsets`` as a standalone consumer; False (logged) if the cluster did not take them."""
        request = pb.CommitOffsetsRequest(
            group_id=self.group_id,
            member_id=STANDALONE_MEMBER,
            generation_id=STANDALONE_GENERATION,
            offsets=[
                pb.OffsetCommit(topic=tp.topic, partition=tp.partition, offset=offset, metadata=metadata)
                for tp, offset in sorted(offsets.items())
            ],
        )
        try:
            response = self._call("CommitOffsets", request)
            _ensure_all_committed(response)
        except GroupOffsetsUnavailable as exc:
            log.warning(
                "group %s: offsets NOT committed (%s); the output's _offsets manifests remain the "
                "source of truth, and the next run commits them again",
                self.group_id,
                exc,
            )
            return False
        return True

    def _call(self, method: str, request):
        """One RPC, trying each gateway in turn while they are unreachable."""
        last: Exception | None = None
        for address in self._addresses:
            stub = gateway_grpc.GatewayStub(self._channel(address))
            try:
                return getattr(stub, method)(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                last = exc
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    break
        raise GroupOffsetsUnavailable(_describe(method, last)) from last

    def _channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]


def _describe(method: str, exc: Exception | None) -> str:
    if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return f"the cluster does not implement {method} yet (UNIMPLEMENTED)"
    if isinstance(exc, grpc.RpcError):
        return f"{method} failed: {error_from_rpc(exc)}"
    return f"{method} failed: no gateway answered"


def _ensure_all_committed(response) -> None:
    failed = [r for r in response.results if r.HasField("error") and r.error.reason]
    if failed:
        first = failed[0]
        raise GroupOffsetsUnavailable(
            f"{len(failed)} partitions refused, first {first.topic}-"
            f"{first.partition}: [{first.error.reason}] {first.error.message}"
        )
