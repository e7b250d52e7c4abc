"""Produce: plan the partitions' batches, append them on the leaders, answer per record.

Behaviour, as a Kafka user expects it:

* Request-level problems raise (the servicer turns them into a status): an empty topic, records
  and batches both set, a negative partition (INVALID_ARGUMENT), a topic the cluster does not
  have even after a metadata refresh (UNKNOWN_TOPIC_OR_PARTITION).
* Everything else is per partition: a partition beyond the topic's count answers
  UNKNOWN_TOPIC_OR_PARTITION, RECORD_TOO_LARGE / CORRUPT_MESSAGE come back from the storage node,
  and the other partitions are written anyway.
* Retriable failures (no leader, NOT_LEADER_OR_FOLLOWER, a dead or restarted node, a partition not
  created yet) are retried after a metadata refresh until the request's deadline (``timeout_ms``,
  default 30 s). As with Kafka's non-idempotent producer, a node that dies after writing but
  before answering can make a retry write the records twice (at-least-once).
* ProduceStream keeps each partition's appends in request order: requests are planned one after
  another as they arrive and queued per partition on the stream's ``AppendQueues``, which keep
  one append in flight per partition and merge what queued up behind it
  (``gateway/server/append_queue.py``). Concurrent unary Produce calls are not ordered among
  themselves (a client that needs order waits for each answer, or uses the stream).
* acks=NONE: the appends are started and the answer goes back at once, with offsets -1. They
  still run to completion (with retries) in the background. Back-pressure, not loss, bounds
  them: at most ``max_unacked`` unary requests' appends at a time (a new one waits for a slot),
  and per stream at most 64 MiB queued (the stream stops reading requests until it drains).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from gateway.server import storage_calls
from gateway.server.append_queue import AppendQueues
from gateway.server.batching import (
    PartitionPayload,
    ProduceCommand,
    assign_partitions,
    build_payloads,
    ensure_valid_command,
    plan_raw,
)
from gateway.server.cluster_snapshot import TopicRoute
from gateway.server.partition_retry import retry_partitions
from gateway.server.routing import Router
from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.clock import SYSTEM_CLOCK, Clock
from services.partitioner import StickyPartitioner

log = logging.getLogger(__name__)

#: A typed request larger than this (encoded) has its batches built on a worker
#: thread: built on the event loop, a 100 MB request held every other client for ~0.3 s.
OFFLOAD_BUILD_BYTES = 4 << 20


class ProducePlan(NamedTuple):
    """A validated request with its batches built, ready to send (a tuple: one per request)."""

    command: ProduceCommand
    #: Each typed record's partition, in request order (empty for pre-encoded batches).
    assignment: list[int]
    payloads: dict[int, PartitionPayload]
    #: Partitions that failed before sending (beyond the topic's partition count).
    failed: dict[int, AppendResult]


class ProduceOutcome(NamedTuple):
    """The answer to one produce request (a tuple: one per request)."""

    topic: str
    #: (partition, offset) per typed record, in request order; offset -1 when not known.
    records: list[tuple[int, int]]
    #: One per partition the request named, ascending.
    partitions: list[AppendResult]
    correlation_id: int = 0


def _record_offsets(
    assignment: list[int], payloads: dict[int, PartitionPayload], results: dict[int, AppendResult]
) -> list[tuple[int, int]]:
    offsets = [-1] * len(assignment)
    for partition, payload in payloads.items():
        result = results[partition]
        if result.error is None and result.base_offset >= 0:
            for position, index in enumerate(payload.record_indexes):
                offsets[index] = result.base_offset + position
    return list(zip(assignment, offsets, strict=True))


def _payload_bytes(plan: ProducePlan) -> dict[int, bytes | memoryview]:
    """Each partition's bytes of ``plan``."""
    payloads = plan.payloads
    if len(payloads) == 1:  # the usual request: no comprehension to run
        for partition, payload in payloads.items():
            return {partition: payload.data}
    return {p: payload.data for p, payload in payloads.items()}


def _unacked_results(plan: ProducePlan) -> dict[int, AppendResult]:
    """acks=none: no offsets are known when the answer goes back."""
    topic = plan.command.topic
    return {
        p: AppendResult(topic, p, record_count=len(payload.record_indexes))
        for p, payload in plan.payloads.items()
    }


def outcome_of(plan: ProducePlan, sent: dict[int, AppendResult]) -> ProduceOutcome:
    """The answer to ``plan``'s request once its partitions were ``sent``."""
    results = {**plan.failed, **sent} if plan.failed else sent
    command = plan.command
    return ProduceOutcome(
        command.topic,
        _record_offsets(plan.assignment, plan.payloads, results),
        [results[p] for p in sorted(results)],
        command.correlation_id,
    )


def _unknown_partition(topic: TopicRoute, partition: int) -> AppendResult:
    return AppendResult(
        topic.name,
        partition,
        error=errors.UnknownTopicOrPartitionError(
            f"topic {topic.name!r} has {topic.partition_count} partitions; "
            f"partition {partition} does not exist"
        ),
    )


class ProduceHandler:
    """Serves produce requests for one gateway (shared sticky partitioner, background appends)."""

    def __init__(
        self,
        router: Router,
        *,
        clock: Clock = SYSTEM_CLOCK,
        default_timeout_ms: int = 30_000,
        max_batch_bytes: int = 1_048_576,
        max_unacked: int = 1_000,
        telemetry=None,
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self._router = router
        #: Runs ``fn()`` on a worker thread (the gateway's decode pool); None builds on the loop.
        self._offload = offload
        #: GatewayInstruments when telemetry is on (batch sizes, span attributes), else None.
        self._telemetry = telemetry
        self._clock = clock
        self._default_timeout_ms = default_timeout_ms
        self._max_batch_bytes = max_batch_bytes
        self._sticky = StickyPartitioner()
        self._unacked = asyncio.Semaphore(max_unacked)
        self._background: set[asyncio.Task] = set()
        # Streams' queues, so that shutdown lets their acks=none appends finish too.
        self._stream_queues: weakref.WeakSet[AppendQueues] = weakref.WeakSet()

    def deadline_for(
        self, command: ProduceCommand, rpc_remaining_s: float | None, *, now: float | None = None
    ) -> float:
        """The loop-clock deadline: ``timeout_ms`` (or the default), capped by the RPC's own;
        ``now``: the loop's time, when the caller has it at hand."""
        timeout_s = (command.timeout_ms or self._default_timeout_ms) / 1000.0
        if rpc_remaining_s is not None:
            timeout_s = min(timeout_s, rpc_remaining_s)
        return (asyncio.get_running_loop().time() if now is None else now) + timeout_s

    async def produce(self, command: ProduceCommand, *, deadline: float) -> ProduceOutcome:
        """Plan and send one request (unary Produce)."""
        return await self.execute(await self.plan(command), deadline=deadline)

    async def plan(self, command: ProduceCommand) -> ProducePlan:
        """Validate, look the topic up and build each partition's batches (no appends yet).

        Raises the request-level errors (invalid request, unknown topic).
        """
        ensure_valid_command(command)
        if not command.records and not command.batches:
            return ProducePlan(command, [], {}, {})
        topic = await self._router.topic(command.topic)
        if topic.partition_count < 1:  # never published so by the coordinator; keeps % safe
            raise errors.LeaderNotAvailableError(f"topic {topic.name!r} has no partitions yet")
        if command.records:
            assignment = assign_partitions(
                command.topic, command.records, topic.partition_count, self._sticky
            )
            build = functools.partial(
                build_payloads,
                command,
                assignment,
                topic.partition_count,
                now_ms=self._clock.time_ms(),
                max_batch_bytes=min(self._max_batch_bytes, topic.max_message_bytes),
            )
            if self._offload is not None and command.request_bytes > OFFLOAD_BUILD_BYTES:
                payloads, unknown = await self._offload(build)
            else:
                payloads, unknown = build()
        else:
            assignment = []
            payloads, unknown = plan_raw(command, topic.partition_count)
        if self._telemetry is not None:
            self._telemetry.produce_planned(command.topic, payloads.values())
        return ProducePlan(command, assignment, payloads, {p: _unknown_partition(topic, p) for p in unknown})

    def plan_now(self, command: ProduceCommand) -> ProducePlan | None:
        """:meth:`plan` without an event-loop turn, for pre-encoded batches of a topic whose
        route is known (the data listener's requests): the plan, or None when :meth:`plan` is
        needed (typed records, an unknown topic: it may refresh the metadata first).

        Raises the same request-level errors as :meth:`plan`."""
        if command.records or not command.batches:
            return None
        topic = self._router.snapshot.topics.get(command.topic)
        if topic is None or topic.partition_count < 1:
            return None
        ensure_valid_command(command)
        payloads, unknown = plan_raw(command, topic.partition_count)
        if self._telemetry is not None:
            self._telemetry.produce_planned(command.topic, payloads.values())
        failed = {p: _unknown_partition(topic, p) for p in unknown} if unknown else {}
        return ProducePlan(command, [], payloads, failed)

    async def execute(self, plan: ProducePlan, *, deadline: float) -> ProduceOutcome:
        """Append the plan's payloads, one Append per leader node (unary Produce)."""
        return outcome_of(plan, await self._send(plan, deadline))

    def enqueue(
        self, plan: ProducePlan, *, deadline: float, queues: AppendQueues
    ) -> Awaitable[ProduceOutcome]:
        """Queue the plan's appends on a stream's queues now; await the result for the outcome.

        Queuing is synchronous, so requests enqueued in arrival order are appended in that order.
        """
        return self._outcome_when_appended(plan, self.submit(plan, deadline=deadline, queues=queues))

    @staticmethod
    def submit(
        plan: ProducePlan, *, deadline: float, queues: AppendQueues
    ) -> asyncio.Future[dict[int, AppendResult]]:
        """:meth:`enqueue` without the outcome: the future resolves to each partition's
        :class:`AppendResult` (:func:`outcome_of` makes the answer; an acks=0 request needs
        none, and need not await it)."""
        command = plan.command
        return queues.submit_all(command.topic, _payload_bytes(plan), command.acks, deadline)

    @staticmethod
    def submit_then(
        plan: ProducePlan,
        *,
        deadline: float,
        queues: AppendQueues,
        done: Callable[[dict[int, AppendResult] | None], None] | None,
    ) -> None:
        """:meth:`submit` with a callback instead of a future (``AppendQueues.submit_then``):
        ``done`` hears the partitions' results in the turn of the loop they are settled (or
        None if abandoned); ``done`` None: nobody does (acks=0)."""
        command = plan.command
        queues.submit_then(command.topic, _payload_bytes(plan), command.acks, deadline, done)

    def stream_queues(self) -> AppendQueues:
        """Fresh per-stream append queues (see ``gateway/server/append_queue.py``)."""
        queues = AppendQueues(self._append_with_retries, append_now=self._append_now)
        self._stream_queues.add(queues)
        return queues

    async def _outcome_when_appended(
        self, plan: ProducePlan, answered: asyncio.Future[dict[int, AppendResult]]
    ) -> ProduceOutcome:
        if plan.command.acks == Acks.NONE:
            return outcome_of(plan, _unacked_results(plan))
        return outcome_of(plan, await answered)

    async def _send(self, plan: ProducePlan, deadline: float) -> dict[int, AppendResult]:
        command = plan.command
        if not plan.payloads:
            return {}
        data = {p: payload.data for p, payload in plan.payloads.items()}
        if command.acks != Acks.NONE:
            return await self._append_with_retries(command.topic, data, command.acks, deadline)
        await self._unacked.acquire()
        task = asyncio.create_task(self._append_with_retries(command.topic, data, command.acks, deadline))
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return _unacked_results(plan)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        self._unacked.release()
        if task.cancelled():
            return
        if task.exception() is not None:
            log.warning("acks=none append failed: %r", task.exception())
            return
        for result in task.result().values():
            if result.error is not None:
                log.info("acks=none append to partition %d failed: %s", result.partition, result.error)

    async def _append_with_retries(
        self,
        topic: str,
        data: dict[int, bytes | memoryview],
        acks: Acks,
        deadline: float,
        settled: Callable[[int, AppendResult], None] | None = None,
        first: dict[int, AppendResult] | None = None,
    ) -> dict[int, AppendResult]:
        """The partitions' appends, one request per leader node, retried within the deadline;
        ``settled`` hears of each partition as soon as its outcome is final (the stream queues'
        appender); ``first``: the results of a first attempt already made (``_append_now``)."""

        async def attempt(partitions: list[int], deadline: float) -> dict[int, AppendResult]:
            if len(partitions) == len(data):
                return await self._do_append_round(topic, data, acks, deadline)
            return await self._do_append_round(topic, {p: data[p] for p in partitions}, acks, deadline)

        return await retry_partitions(
            data, attempt, refresh=self._router.refresh, deadline=deadline, on_final=settled, first=first
        )

    def _append_now(
        self,
        topic: str,
        data: dict[int, bytes | memoryview],
        acks: Acks,
        deadline: float,
        done: Callable[[dict[int, AppendResult]], None],
    ) -> bool:
        """The first attempt of :meth:`_append_with_retries` without a coroutine, when every
        partition's leader is one node whose data-port connection is open (the usual case):
        sent now, ``done`` hears the results from the callback that reads the node's answer.
        False (nothing sent) when the full path is needed: a partition without a leader, several
        nodes, no connection open yet, telemetry on, a large frame."""
        snapshot = self._router.snapshot
        route = snapshot.topics.get(topic)
        if route is None:
            return False
        routes = route.partitions
        count = len(routes)
        leader = -1
        epochs: dict[int, int] = {}
        for partition in data:
            # ensure_leader's checks; what fails them is answered (and retried) by the full path
            if not 0 <= partition < count:
                return False
            partition_route = routes[partition]
            if partition_route.error is not None or (leader != partition_route.leader and leader != -1):
                return False
            leader = partition_route.leader
            epochs[partition] = partition_route.leader_epoch
        node = snapshot.nodes.get(leader)
        if node is None:
            return False
        appends = self._router.clients.appends(node)
        if appends is None:
            return False
        return appends.append_now(topic, data, acks=acks, deadline=deadline, leader_epochs=epochs, done=done)

    async def _do_append_round(
        self, topic: str, data: dict[int, bytes | memoryview], acks: Acks, deadline: float
    ) -> dict[int, AppendResult]:
        """One append per leader node, concurrently (over its data port, else gRPC); a partition
        without a leader fails this round."""
        snapshot = self._router.snapshot
        results: dict[int, AppendResult] = {}
        by_node: dict = {}
        epochs: dict[int, int] = {}
        for partition, payload in data.items():
            try:
                node = snapshot.ensure_leader(topic, partition)
            except errors.TributaryError as exc:
                results[partition] = AppendResult(topic, partition, error=exc)
                continue
            by_node.setdefault(node, {})[partition] = payload
            # The leader checks it: a leader deposed since this metadata answers FENCED_LEADER_EPOCH.
            epochs[partition] = snapshot.topics[topic].partitions[partition].leader_epoch
        timeout_s = deadline - asyncio.get_running_loop().time()
        clients = self._router.clients

        def append_to(node, payloads):
            return storage_calls.append(
                clients.storage(node),
                topic,
                payloads,
                acks=acks,
                timeout_s=timeout_s,
                leader_epochs=epochs,
                data_port=clients.appends(node),
            )

        if len(by_node) == 1:  # the usual case: no task, no gather
            ((node, payloads),) = by_node.items()
            answer = await append_to(node, payloads)
            if not results:
                return answer
            results.update(answer)
            return results
        answers = await asyncio.gather(*(append_to(node, payloads) for node, payloads in by_node.items()))
        for answer in answers:
            results.update(answer)
        return results

    async def close(self) -> None:
        """Let background (acks=none) appends finish, within their own deadlines."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(
            *(queues.close() for queues in list(self._stream_queues)), return_exceptions=True
        )
