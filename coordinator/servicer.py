"""The Coordinator gRPC servicer: translation between protobuf and :mod:`coordinator.handlers`.

Each RPC decodes, calls one handler, encodes; errors are mapped once by ``translate_errors``.
Admin RPCs additionally forward to the active controller when this coordinator is a standby
(:mod:`coordinator.redirect`). Group RPCs are not implemented yet: the generated base class
answers UNIMPLEMENTED.
"""

from __future__ import annotations

import functools

from coordinator import serde
from coordinator.handlers import CoordinatorHandlers
from coordinator.redirect import ControllerMovedError, Forwarder
from services.grpc_server import translate_errors
from services.proto import coordinator_grpc, pb


#: A watch re-checks etcd health at least this often even when nothing changes.
WATCH_HEARTBEAT_S = 5.0


class _RevisionMemo:
    """Encoded answers kept while the etcd revision they were built at is current.

    Building the metadata of thousands of partitions costs milliseconds of Python per request;
    between two metadata changes every answer to the same question is identical.
    """

    def __init__(self, max_entries: int = 256) -> None:
        self._revision = -1
        self._entries: dict = {}
        self._max_entries = max_entries

    def get_or_build(self, revision: int, key, build):
        if revision != self._revision:
            self._revision, self._entries = revision, {}
        answer = self._entries.get(key)
        if answer is None:
            answer = build()
            if len(self._entries) < self._max_entries:
                self._entries[key] = answer
        return answer


def _admin(method):
    """An admin RPC: on a standby, forward the request to the active controller."""
    name = method.__name__

    @functools.wraps(method)
    async def forwarding(self, request, context):
        try:
            return await method(self, request, context)
        except ControllerMovedError as moved:
            return await self._forwarder.forward(moved, name, request, context)

    return translate_errors(forwarding)


class CoordinatorServicer(coordinator_grpc.CoordinatorServicer):
    def __init__(self, handlers: CoordinatorHandlers, forwarder: Forwarder) -> None:
        self._handlers = handlers
        self._forwarder = forwarder
        self._metadata_memo = _RevisionMemo()

    @translate_errors
    async def GetMetadata(self, request, context):
        topics = tuple(request.topics)
        return self._metadata_memo.get_or_build(
            self._handlers.metadata_revision(), topics,
            lambda: serde.metadata_to_proto(self._handlers.get_metadata(topics)))

    @translate_errors
    async def WatchMetadata(self, request, context):
        """The whole metadata now, then again after every change (gateways' routing caches).

        The stream ends with UNAVAILABLE when etcd cannot vouch for the cache; the caller
        reconnects (to this or another coordinator) and gets a fresh snapshot.
        """
        sent = request.after_revision
        while True:
            revision = self._handlers.metadata_revision()
            if revision > sent:
                yield self._metadata_memo.get_or_build(
                    revision, (), lambda: serde.metadata_to_proto(self._handlers.get_metadata(())))
                sent = revision
            await self._handlers.wait_for_metadata_after(sent, timeout=WATCH_HEARTBEAT_S)

    @translate_errors
    async def GetControllerInfo(self, request, context):
        return serde.controller_status_to_proto(self._handlers.controller_status())

    @translate_errors
    async def DescribeTopics(self, request, context):
        lookups = self._handlers.describe_topics(list(request.names), include_defaults=request.include_defaults)
        return pb.DescribeTopicsResponse(topics=[serde.description_to_proto(t) for t in lookups])

    @translate_errors
    async def ListTopics(self, request, context):
        return pb.ListTopicsResponse(names=self._handlers.list_topics())

    @_admin
    async def CreateTopic(self, request, context):
        view = await self._handlers.create_topic(serde.topic_spec_from_proto(request))
        return pb.CreateTopicResponse(topic=serde.topic_to_proto(view))

    @_admin
    async def DeleteTopic(self, request, context):
        await self._handlers.delete_topic(request.name)
        return pb.DeleteTopicResponse()

    @_admin
    async def CreatePartitions(self, request, context):
        view = await self._handlers.create_partitions(request.topic, request.total_count,
                                                      validate_only=request.validate_only)
        return pb.CreatePartitionsResponse(topic=serde.topic_to_proto(view))

    @_admin
    async def AlterTopicConfigs(self, request, context):
        lookup = await self._handlers.alter_topic_configs(
            request.topic, dict(request.set), list(request.delete), validate_only=request.validate_only)
        return pb.AlterTopicConfigsResponse(topic=serde.description_to_proto(lookup))
