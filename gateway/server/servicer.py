"""The public Gateway gRPC servicer: protobuf in, one handler call, protobuf out.

Each data-plane RPC decodes with :mod:`gateway.server.serde`, calls one handler and encodes the answer;
errors raised as the taxonomy become a status with the Kafka reason (``translate_errors``).
Admin, metadata and group RPCs carry the coordinator's own messages and are forwarded as they are.

Client quotas (:mod:`gateway.server.quotas`) meter Produce, ProduceStream and Fetch: an answer
that takes its client over a quota carries ``throttle_time_ms``; a ProduceStream then reads no
further request for that long, and unary calls of the same allowance wait that long first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from gateway.server import serde
from gateway.server.admin_forwarder import Forwarder
from gateway.server.authentication import Authenticator
from gateway.server.authorization import FILTERED, Gatekeeper, grpc_host
from gateway.server.clients import ClientLog
from gateway.server.decode_pool import DecodePool
from gateway.server.delete_records import DeleteRecordsHandler
from gateway.server.fetch import FetchHandler
from gateway.server.loop_time import LoopTime, timed
from gateway.server.offsets import OffsetsHandler
from gateway.server.produce import ProduceHandler
from gateway.server.quotas import ChannelThrottle, ClientQuota, ClientQuotas
from services import errors
from services.acls import ResourceType
from services.grpc_server import translate_errors
from services.proto import gateway_grpc, pb
from services.serde import error_to_proto

log = logging.getLogger(__name__)

#: ProduceStream requests being served at once per stream; the stream stops reading beyond it.
MAX_STREAM_IN_FLIGHT = 1_000
#: Kafka's connections.max.idle.ms: a ProduceStream without a request this long is ended.
DEFAULT_STREAM_MAX_IDLE_MS = 600_000


class _StreamActivity:
    """What the idle check of one ProduceStream looks at: answers still owed, and when the stream
    last moved (a request in or an answer out). Owed answers mean it is not idle, however long
    they take."""

    __slots__ = ("last", "owed")

    def __init__(self, now: float) -> None:
        self.last = now
        self.owed = 0

    def received(self, now: float) -> None:
        self.owed += 1
        self.last = now

    def answered(self, now: float) -> None:
        self.owed -= 1
        self.last = now


async def _encode_outcome(outcome):
    return serde.produce_outcome_to_proto(await outcome)


async def _metered_answer(
    answer: asyncio.Future, quota: ClientQuota, spent: LoopTime, throttle: ChannelThrottle
):
    """A ProduceStream answer, its loop time counted on its client's quotas, saying how long
    from now the stream is held."""
    response = await answer
    throttle.hold(quota.record_loop_time(spent.seconds))
    response.throttle_time_ms = throttle.remaining_ms()
    return response


def _forward(method: str):
    """A servicer method that forwards ``method`` to a coordinator unchanged."""

    async def forward(self, request, context):
        self._clients.seen(context, method)
        self._authorize(context, method, request)
        response = await self._forwarder.forward(method, request, rpc_remaining_s=context.time_remaining())
        return self._filtered(context, method, response)

    forward.__name__ = method
    forward.__qualname__ = f"GatewayServicer.{method}"
    return translate_errors(forward)


class GatewayServicer(gateway_grpc.GatewayServicer):
    """``tributary.v1.Gateway``: the behaviour of each RPC is documented in gateway.proto and in
    the handler modules; ProduceStream's in-band errors in ``serde.produce_error_to_proto``."""

    def __init__(
        self,
        produce: ProduceHandler,
        fetch: FetchHandler,
        offsets: OffsetsHandler,
        forwarder: Forwarder,
        decode_pool: DecodePool,
        delete_records: DeleteRecordsHandler,
        *,
        default_timeout_ms: int = 30_000,
        stream_max_idle_ms: int = DEFAULT_STREAM_MAX_IDLE_MS,
        data_address: str = "",
        gatekeeper: Gatekeeper | None = None,
        authenticator: Authenticator | None = None,
        quotas: ClientQuotas | None = None,
    ) -> None:
        #: The authorizer's decisions (None: authorization off, every call allowed).
        self._gate = gatekeeper
        #: Who a caller is (its certificate, or its bearer token).
        self._authenticator = authenticator or Authenticator()
        #: Client quotas (None: none enforced).
        self._quotas = quotas
        self._produce = produce
        self._fetch = fetch
        self._decode_pool = decode_pool
        self._offsets = offsets
        self._forwarder = forwarder
        self._delete_records = delete_records
        self._clients = ClientLog()
        self._default_timeout_s = default_timeout_ms / 1000.0
        #: None = streams are never ended for idleness.
        self._stream_max_idle_s = stream_max_idle_ms / 1000.0 if stream_max_idle_ms > 0 else None
        #: host:port of this gateway's raw data listener, "" when it has none (GetMetadata says so).
        self._data_address = data_address

    # ---- authorization ------------------------------------------------------------------------

    def _authorize(self, context, method: str, request) -> None:
        """Refuse the call unless the caller's principal may make it (authorization on)."""
        if self._gate is not None and method not in FILTERED:
            self._gate.check(self._authenticator.call_principal(context), grpc_host(context), method, request)

    def _filtered(self, context, method: str, response):
        """Listings keep only what the caller may DESCRIBE (authorization on)."""
        gate = self._gate
        if gate is None:
            return response
        principal, host = self._authenticator.call_principal(context), grpc_host(context)
        if method == "ListTopics":
            kept = [n for n in response.names if gate.may_describe(principal, host, ResourceType.TOPIC, n)]
            del response.names[:]
            response.names.extend(kept)
        elif method == "ListGroups":
            groups = [
                g
                for g in response.groups
                if gate.may_describe(principal, host, ResourceType.GROUP, g.group_id)
            ]
            del response.groups[:]
            response.groups.extend(groups)
        elif method == "DescribeTopics":
            topics = [
                t
                for t in response.topics
                if gate.may_describe(principal, host, ResourceType.TOPIC, t.metadata.name)
            ]
            del response.topics[:]
            response.topics.extend(topics)
        return response

    # ---- client quotas ------------------------------------------------------------------------

    def _quota(self, principal: str | None, context, client_id: str) -> ClientQuota | None:
        """The quotas of the calling client (None: none applies, nothing to meter)."""
        quotas = self._quotas
        if quotas is None or not quotas.configured:
            return None
        return quotas.client(
            principal if principal is not None else self._authenticator.call_principal(context), client_id
        )

    # ---- data plane ------------------------------------------------------------------------

    @translate_errors
    async def Produce(self, request, context):
        client_id = self._clients.seen(context, "Produce")
        self._authorize(context, "Produce", request)
        quota = self._quota(None, context, client_id)
        if quota is None:
            return await self._do_produce(request, context)
        await quota.wait_unmuted(quota.produce)
        quota.record_produce_bytes(request.ByteSize())
        spent = LoopTime()
        producing = self._do_produce(request, context)
        response = await (timed(producing, spent) if quota.times_requests else producing)
        quota.record_loop_time(spent.seconds)
        response.throttle_time_ms = quota.held_ms(quota.produce)
        return response

    async def _do_produce(self, request, context):
        command = serde.produce_command_from_proto(request)
        deadline = self._produce.deadline_for(command, context.time_remaining())
        outcome = await self._produce.produce(command, deadline=deadline)
        return serde.produce_outcome_to_proto(outcome)

    @translate_errors
    async def ProduceStream(self, request_iterator, context):
        """Answers in request order. A stream with no request and no answer owed for
        ``stream_max_idle_ms`` is ended with NETWORK_EXCEPTION (UNAVAILABLE, retriable), as a
        Kafka broker closes a connection idle for connections.max.idle.ms; clients open a new
        stream for their next request."""
        client_id = self._clients.seen(context, "ProduceStream")
        loop = asyncio.get_running_loop()
        activity = _StreamActivity(loop.time())
        in_flight: asyncio.Queue = asyncio.Queue(MAX_STREAM_IN_FLIGHT)
        reader = asyncio.create_task(
            self._read_stream(request_iterator, context, in_flight, activity, client_id)
        )
        try:
            while (task := await in_flight.get()) is not None:
                answer = await task
                activity.answered(loop.time())
                yield answer
            await reader  # re-raises a failure to read the stream (or its idleness)
        finally:
            reader.cancel()
            while not in_flight.empty():
                task = in_flight.get_nowait()
                if task is not None:
                    task.cancel()

    async def _read_stream(
        self, request_iterator, context, in_flight: asyncio.Queue, activity: _StreamActivity, client_id: str
    ) -> None:
        """Plan and queue each request as it arrives, in order; appends run while more come in.
        A request whose client is throttled waits for the throttle to end first (the stream is
        held: nothing more is read from it meanwhile)."""
        queues = self._produce.stream_queues()
        throttle = ChannelThrottle()
        principal = self._authenticator.call_principal(context) if self._quotas is not None else None
        try:
            async for request in self._requests_until_idle(request_iterator, activity):
                await throttle.wait()
                quota = self._quota(principal, context, client_id)
                if quota is None:
                    answer = await self._start_in_stream(request, context, queues)
                else:
                    # Counted as it is read: the stream is held from the next request on.
                    throttle.hold(quota.record_produce_bytes(request.ByteSize()))
                    spent = LoopTime()
                    starting = self._start_in_stream(request, context, queues, spent)
                    answer = await (timed(starting, spent) if quota.times_requests else starting)
                    answer = asyncio.ensure_future(_metered_answer(answer, quota, spent, throttle))
                await in_flight.put(answer)
                await queues.wait_for_room()
        finally:
            await in_flight.put(None)

    async def _requests_until_idle(self, request_iterator, activity: _StreamActivity):
        """The stream's requests; raises NetworkError once it has been idle too long."""
        loop = asyncio.get_running_loop()
        idle_s = self._stream_max_idle_s
        iterator = aiter(request_iterator)
        while True:
            next_request = asyncio.ensure_future(anext(iterator))
            try:
                while not next_request.done():
                    idle_for = loop.time() - activity.last
                    if idle_s is not None and not activity.owed and idle_for >= idle_s:
                        raise errors.NetworkError(
                            f"ProduceStream ended by the gateway: idle for {idle_for * 1000:.0f} ms "
                            f"(produce_stream_max_idle_ms={idle_s * 1000:.0f}); open a new stream"
                        )
                    wait_s = None if idle_s is None else (idle_s if activity.owed else idle_s - idle_for)
                    await asyncio.wait({next_request}, timeout=wait_s)
            except BaseException:
                next_request.cancel()
                raise
            try:
                request = next_request.result()
            except StopAsyncIteration:
                return
            activity.received(loop.time())
            yield request

    async def _start_in_stream(
        self, request, context, queues, spent: LoopTime | None = None
    ) -> asyncio.Future:
        """A future of the request's answer; a request that fails as a whole is answered in-band.
        With ``spent``, the loop time of encoding the answer counts there (request quotas)."""
        try:
            self._authorize(context, "Produce", request)
            command = serde.produce_command_from_proto(request)
            plan = await self._produce.plan(command)
        except errors.TributaryError as exc:
            answer = asyncio.get_running_loop().create_future()
            answer.set_result(serde.produce_error_to_proto(request, exc))
            return answer
        deadline = self._produce.deadline_for(command, context.time_remaining())
        outcome = self._produce.enqueue(plan, deadline=deadline, queues=queues)
        encoding = _encode_outcome(outcome)
        return asyncio.ensure_future(timed(encoding, spent) if spent is not None else encoding)

    @translate_errors
    async def Fetch(self, request, context):
        client_id = self._clients.seen(context, "Fetch")
        self._authorize(context, "Fetch", request)
        quota = self._quota(None, context, client_id)
        if quota is None:
            return await self._do_fetch(request, context, None)
        await quota.wait_unmuted(quota.fetch)
        spent = LoopTime()
        fetching = self._do_fetch(request, context, quota)
        response = await (timed(fetching, spent) if quota.times_requests else fetching)
        quota.record_fetch_bytes(response.ByteSize())
        quota.record_loop_time(spent.seconds)
        response.throttle_time_ms = quota.held_ms(quota.fetch)
        return response

    async def _do_fetch(self, request, context, quota: ClientQuota | None):
        command = serde.fetch_command_from_proto(request)
        if quota is not None:
            command = dataclasses.replace(command, max_bytes=quota.fetch_max_bytes(command.max_bytes))
        results = await self._fetch.fetch(command, rpc_remaining_s=context.time_remaining())
        if command.raw_batches:
            return serde.fetch_response_to_proto(results)
        # Typed records become protobuf on the decode pool too, and once the answer is sent the
        # pool may hand memory back (see gateway/server/decode_pool.py).
        context.add_done_callback(self._decode_pool.answer_sent)
        return await self._decode_pool.run(serde.fetch_response_to_proto, results)

    def _deadline(self, context, timeout_ms: int = 0) -> float:
        """The loop time by which to answer: ``timeout_ms`` (0 = the default), within the call's
        own deadline."""
        timeout = timeout_ms / 1000.0 if timeout_ms > 0 else self._default_timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, remaining)
        return asyncio.get_running_loop().time() + timeout

    @translate_errors
    async def ListOffsets(self, request, context):
        self._authorize(context, "ListOffsets", request)
        outcomes = await self._offsets.list_offsets(
            serde.offset_queries_from_proto(request),
            deadline=self._deadline(context),
            read_committed=serde.read_committed_from_proto(request.isolation_level),
        )
        return serde.offsets_to_proto(outcomes)

    @translate_errors
    async def DeleteRecords(self, request, context):
        if request.timeout_ms < 0:
            raise errors.InvalidRequestError(f"timeout_ms {request.timeout_ms} is negative")
        self._authorize(context, "DeleteRecords", request)
        outcomes = await self._delete_records.delete_records(
            serde.deletions_from_proto(request), deadline=self._deadline(context, request.timeout_ms)
        )
        return serde.deletions_to_proto(outcomes)

    # ---- metadata and admin (forwarded) ------------------------------------------------------

    @translate_errors
    async def GetMetadata(self, request, context):
        """Forwarded, with this gateway's raw data listener added (``data_address``). Setting
        it on a response the metadata cache may keep is harmless: it is this gateway's, always."""
        response = await self._forwarder.get_metadata(request, rpc_remaining_s=context.time_remaining())
        if self._gate is not None:
            # A shared (cached) answer is not filtered in place: a copy per caller.
            filtered = type(response)()
            filtered.CopyFrom(response)
            principal, host = self._authenticator.call_principal(context), grpc_host(context)
            topics = []
            for topic in filtered.topics:
                if self._gate.may_describe(principal, host, ResourceType.TOPIC, topic.name):
                    topics.append(topic)
                elif request.topics:  # named: say why, as Kafka does; all topics: left out
                    refusal = errors.TopicAuthorizationFailedError(
                        f"{principal} may not describe {topic.name!r}"
                    )
                    topics.append(pb.TopicMetadata(name=topic.name, error=error_to_proto(refusal)))
            del filtered.topics[:]
            filtered.topics.extend(topics)
            response = filtered
        response.data_address = self._data_address
        return response

    CreateTopic = _forward("CreateTopic")
    DeleteTopic = _forward("DeleteTopic")
    DescribeTopics = _forward("DescribeTopics")
    ListTopics = _forward("ListTopics")
    CreatePartitions = _forward("CreatePartitions")
    AlterTopicConfigs = _forward("AlterTopicConfigs")
    ElectLeaders = _forward("ElectLeaders")
    AlterPartitionReassignments = _forward("AlterPartitionReassignments")
    ListPartitionReassignments = _forward("ListPartitionReassignments")

    # ---- consumer groups (forwarded to the controller) ---------------------------------------

    @translate_errors
    async def JoinGroup(self, request, context):
        """Forwarded; an empty ``client_id`` is filled from the call's ``tributary-client-id``
        metadata, so ``groups describe`` shows every member's client."""
        client_id = self._clients.seen(context, "JoinGroup")
        self._authorize(context, "JoinGroup", request)
        if not request.client_id and client_id:
            request.client_id = client_id
        return await self._forwarder.forward("JoinGroup", request, rpc_remaining_s=context.time_remaining())

    Heartbeat = _forward("Heartbeat")
    LeaveGroup = _forward("LeaveGroup")
    CommitOffsets = _forward("CommitOffsets")
    FetchCommittedOffsets = _forward("FetchCommittedOffsets")
    ListGroups = _forward("ListGroups")
    DescribeGroup = _forward("DescribeGroup")
    ResetGroupOffsets = _forward("ResetGroupOffsets")
    DeleteGroup = _forward("DeleteGroup")

    # ---- idempotent and transactional producers (forwarded to the controller) ---------------

    InitProducerId = _forward("InitProducerId")
    AddPartitionsToTxn = _forward("AddPartitionsToTxn")
    AddOffsetsToTxn = _forward("AddOffsetsToTxn")
    TxnOffsetCommit = _forward("TxnOffsetCommit")
    EndTxn = _forward("EndTxn")
    DescribeTransactions = _forward("DescribeTransactions")

    # ---- ACLs (forwarded) ----------------------------------------------------------------------

    CreateAcls = _forward("CreateAcls")
    DescribeAcls = _forward("DescribeAcls")
    DeleteAcls = _forward("DeleteAcls")

    # ---- client quotas (forwarded) -------------------------------------------------------------

    AlterClientQuotas = _forward("AlterClientQuotas")
    DescribeClientQuotas = _forward("DescribeClientQuotas")
