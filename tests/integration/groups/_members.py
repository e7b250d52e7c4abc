"""A consumer-group member played by raw gRPC stubs, as any language's client would be.

:class:`SimMember` follows the protocol an SDK must implement (see ``coordinator/groups``):
join; then heartbeat every ``heartbeat_s`` -- at once after a response that revoked something,
every ~100 ms while partitions are pending -- reporting what it still owns; on a response,
"commit" and drop the revoked partitions and take the new assignment; on UNKNOWN_MEMBER_ID join
again (same instance id for a static member); stop on FENCED_INSTANCE_ID. Retriable errors
(a coordinator failing over) are retried. :meth:`kill` stops the loop without a word to the
coordinator -- what ``kill -9`` of a consumer process looks like from the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from services import errors
from services.proto import pb

PENDING_HEARTBEAT_S = 0.1


def tp_set(messages) -> set[tuple[str, int]]:
    return {(m.topic, m.partition) for m in messages}


def call(method, request, *, timeout: float = 10.0):
    """A stub call whose failure is raised as the typed taxonomy error."""
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise errors.error_from_rpc(exc) from exc


class SimMember:
    """One group member on its own heartbeat thread. Thread-safe reads of its public fields."""

    def __init__(
        self,
        stub: Any,
        group: str,
        *,
        topics=(),
        pattern: str = "",
        assignor=pb.ASSIGNOR_COOPERATIVE_STICKY,
        instance_id: str = "",
        session_ms: int = 3000,
        heartbeat_s: float = 0.3,
        name: str = "sim",
        max_poll_interval_ms: int = 0,
        on_revoke: Callable[[SimMember, set], None] | None = None,
    ) -> None:
        self.stub = stub
        self.group = group
        self.subscription = pb.Subscription(topics=list(topics), pattern=pattern)
        self.assignor = assignor
        self.instance_id = instance_id
        self.session_ms = session_ms
        self.heartbeat_s = heartbeat_s
        self.name = name
        self.on_revoke = on_revoke
        self.max_poll_interval_ms = max_poll_interval_ms
        #: What heartbeats say about the application polling (False: a stuck application).
        self.polled = True
        self.member_id = ""
        self.generation = -1
        self.owned: set[tuple[str, int]] = set()
        self.pending: set[tuple[str, int]] = set()
        #: Every partition ever in a revoke list, in order.
        self.revoked: list[tuple[str, int]] = []
        self.joins = 0
        self.errors: list[errors.TributaryError] = []
        self.fenced = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()

    # -- protocol ---------------------------------------------------------------------------------

    def join(self) -> Any:
        request = pb.JoinGroupRequest(
            group_id=self.group,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            client_id=self.name,
            subscription=self.subscription,
            assignor=self.assignor,
            session_timeout_ms=self.session_ms,
            max_poll_interval_ms=self.max_poll_interval_ms,
        )
        response = call(self.stub.JoinGroup, request)
        with self.lock:
            self.member_id, self.generation = response.member_id, response.generation_id
            self.owned, self.pending = tp_set(response.assignment), tp_set(response.pending)
            self.joins += 1
        return response

    def heartbeat(self) -> Any:
        with self.lock:
            request = pb.HeartbeatRequest(
                group_id=self.group,
                member_id=self.member_id,
                generation_id=self.generation,
                polled=self.polled,
                owned=[pb.TopicPartition(topic=t, partition=p) for t, p in sorted(self.owned)],
                group_instance_id=self.instance_id,
            )
        response = call(self.stub.Heartbeat, request)
        revoke = tp_set(response.revoke)
        if revoke and self.on_revoke is not None:
            self.on_revoke(self, revoke)  # e.g. commit the revoked partitions before letting go
        with self.lock:
            self.revoked.extend(sorted(revoke))
            self.generation = response.generation_id
            self.owned, self.pending = tp_set(response.assignment), tp_set(response.pending)
        return response

    def commit(self, offsets: dict[tuple[str, int], int], *, generation: int | None = None):
        request = pb.CommitOffsetsRequest(
            group_id=self.group,
            member_id=self.member_id,
            generation_id=self.generation if generation is None else generation,
            group_instance_id=self.instance_id,
            offsets=[pb.OffsetCommit(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()],
        )
        return call(self.stub.CommitOffsets, request)

    def leave(self) -> None:
        self.stop()
        call(self.stub.LeaveGroup, pb.LeaveGroupRequest(group_id=self.group, member_id=self.member_id))

    # -- the loop ---------------------------------------------------------------------------------

    def start(self) -> SimMember:
        if not self.member_id:
            self._retrying(self.join)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"member-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            try:
                response = self.heartbeat()
                delay = (
                    0.0 if response.revoke else PENDING_HEARTBEAT_S if response.pending else self.heartbeat_s
                )
            except errors.UnknownMemberIdError as exc:
                self.errors.append(exc)
                with self.lock:
                    self.member_id, self.owned = "", set()
                self._retrying(self.join)
                delay = 0.0
            except errors.FencedInstanceIdError as exc:
                self.errors.append(exc)
                self.fenced = True
                return
            except errors.TributaryError as exc:
                if not exc.retriable:
                    raise
                self.errors.append(exc)
                delay = 0.2

    def _retrying(self, action: Callable[[], Any], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                action()
                return None
            except errors.TributaryError as exc:
                if not exc.retriable or time.monotonic() > deadline or self._stop.is_set():
                    raise
                self.errors.append(exc)
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    kill = stop  # nothing is sent: the coordinator finds out when the session times out

    def snapshot(self) -> tuple[str, int, frozenset, frozenset]:
        with self.lock:
            return self.member_id, self.generation, frozenset(self.owned), frozenset(self.pending)


def converged(members: list[SimMember], partitions: set[tuple[str, int]]) -> bool:
    """Every partition owned by exactly one of ``members``, nobody waiting for more."""
    owned = [tp for m in members for tp in m.snapshot()[2]]
    return (
        len(owned) == len(set(owned))
        and set(owned) == partitions
        and not any(m.snapshot()[3] for m in members)
    )


def settled(members: list[SimMember], partitions: set[tuple[str, int]]) -> bool:
    """:func:`converged`, and every member has heard of the same generation (a member whose
    ownership did not change learns of a new generation only on its next regular heartbeat)."""
    return converged(members, partitions) and len({m.snapshot()[1] for m in members}) == 1
