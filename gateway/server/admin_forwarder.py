"""Metadata, topic admin and group calls: forwarded to the coordinators unchanged.

The public messages are the coordinator's own (``admin.proto``, ``groups.proto``), so there is
nothing to translate: :meth:`Forwarder.forward` sends the request to a coordinator that answers
(the pool fails over and follows NOT_CONTROLLER redirects) and retries while the cluster has no
controller (NOT_CONTROLLER without a redirect, e.g. during an election), within the deadline.
A coordinator's error comes back as the same typed error, so the client sees its reason.

GetMetadata is served by a coordinator too (any of them answers from its watch-fed cache), so
clients always see the newest metadata; the gateway installs an all-topics answer in its own cache,
and answers from that cache alone when no coordinator can be reached.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.server.coordinators import CoordinatorPool
from gateway.server.routing import MetadataWatch
from services import errors
from services.proto import pb
from services.serde import error_to_proto

log = logging.getLogger(__name__)

_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
#: GetMetadata gives up on the coordinators sooner than admin calls: the cache can answer.
_METADATA_TIMEOUT_S = 5.0
#: Answers after which sending the request again is safe: NOT_CONTROLLER (not executed) and "no
#: coordinator reachable" (almost always a refused connection; a coordinator that dies mid-call
#: could make a retried CreateTopic answer TOPIC_ALREADY_EXISTS, as Kafka's admin client can).
_NOT_EXECUTED = (errors.NotControllerError, errors.CoordinatorNotAvailableError)


class Forwarder:
    """Sends the gateway's admin, group and metadata calls to the coordinators."""

    def __init__(
        self, coordinators: CoordinatorPool, cache: MetadataWatch, *, timeout_s: float = 30.0
    ) -> None:
        self._coordinators = coordinators
        self._cache = cache
        self._timeout_s = timeout_s

    def _deadline(self, rpc_remaining_s: float | None) -> float:
        timeout = self._timeout_s if rpc_remaining_s is None else min(self._timeout_s, rpc_remaining_s)
        return asyncio.get_running_loop().time() + timeout

    async def forward(self, method: str, request, *, rpc_remaining_s: float | None = None):
        """``Coordinator.<method>(request)``'s response, or its typed error."""
        loop = asyncio.get_running_loop()
        deadline = self._deadline(rpc_remaining_s)
        attempt = 0
        while True:
            try:
                return await self._coordinators.call(
                    method, request, timeout=max(deadline - loop.time(), 0.001)
                )
            except _NOT_EXECUTED as exc:
                backoff = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                if loop.time() + backoff >= deadline:
                    raise
                log.debug("%s not served yet (%s); retrying in %.2fs", method, exc, backoff)
                await asyncio.sleep(backoff)
                attempt += 1

    async def get_metadata(self, request, *, rpc_remaining_s: float | None = None):
        """Fresh metadata from a coordinator, else (none answers) the gateway's cached snapshot."""
        timeout = (
            _METADATA_TIMEOUT_S if rpc_remaining_s is None else min(_METADATA_TIMEOUT_S, rpc_remaining_s)
        )
        try:
            response = await self._coordinators.call("GetMetadata", request, timeout=timeout)
        except (errors.CoordinatorNotAvailableError, errors.RequestTimedOutError) as exc:
            if self._cache.snapshot.revision < 0:
                raise
            log.info("serving GetMetadata from the cache: %s", exc)
            return cached_metadata(self._cache.snapshot.source, list(request.topics))
        if not request.topics:
            self._cache.apply(response)
        return response


def cached_metadata(source, topics: list[str]):
    """``source`` (a full GetMetadataResponse) limited to ``topics`` (all when empty)."""
    if not topics:
        return source
    response = pb.GetMetadataResponse()
    response.CopyFrom(source)
    by_name = {t.name: t for t in source.topics}
    del response.topics[:]
    for name in topics:
        if name in by_name:
            response.topics.append(by_name[name])
        else:
            error = errors.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            response.topics.append(pb.TopicMetadata(name=name, error=error_to_proto(error)))
    return response
