"""A storage node's line to the active controller.

* Watches ``controller`` and ``controller_epoch`` in etcd: the newest controller epoch goes to
  the :class:`ReplicaManager` at once, so a deposed controller's calls are refused as soon as
  its successor is elected (not only after the successor's first call), and the active
  controller's address is where AlterPartition goes.
* Sends AlterPartition (:meth:`ControllerChannel.submit`): the ISR changes asked for in one turn
  of the event loop go in one request; each answer is applied to its partition
  (``Partition.apply_state``) or reported to it as failed, to be asked again later.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import grpc.aio

from services import errors
from services.cluster_keys import CONTROLLER, CONTROLLER_EPOCH, ControllerRecord, decode_controller_epoch
from services.etcd.client import EtcdClient
from services.etcd.values import EventType, KeyValue, WatchResync
from services.grpc_server import INTERNAL_CHANNEL_OPTIONS
from services.proto import coordinator_grpc, pb
from services.serde import error_from_proto, leader_and_isr_from_proto
from services.tls import ChannelRotation, ClientTls, aio_channel, retire_channels
from storage_node.replication.manager import ReplicaManager
from storage_node.replication.partition import Partition

log = logging.getLogger(__name__)


class ControllerChannel:
    """Follows the active controller in etcd and carries AlterPartition requests to it."""

    def __init__(
        self,
        client: EtcdClient,
        manager: ReplicaManager,
        *,
        timeout_s: float = 5.0,
        tls: ClientTls | None = None,
    ) -> None:
        self._client = client
        #: Mutual TLS to the controller (the node's member certificate); None: plaintext.
        self._tls = tls
        self._rotation = ChannelRotation(tls)
        self._manager = manager
        self._timeout_s = timeout_s
        self.active: ControllerRecord | None = None
        self._watch_task: asyncio.Task | None = None
        self._queued: dict[tuple[str, int], tuple[Partition, tuple[int, ...]]] = {}
        self._flush_scheduled = False
        self._sending: set[asyncio.Task] = set()
        self._channel: tuple[str, grpc.aio.Channel] | None = None

    async def start(self) -> None:
        watch = await self._client.watch_prefix(CONTROLLER, snapshot=True)
        self._watch_task = asyncio.create_task(self._follow(watch), name="controller-watch")

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        if self._channel is not None:
            await self._channel[1].close()

    # ---- the controller in etcd ------------------------------------------------------------------

    async def _follow(self, watch) -> None:
        try:
            async for item in watch:
                if isinstance(item, WatchResync):
                    self.active = None
                    for kv in item.kvs:
                        self._on_key(kv)
                elif item.type is EventType.DELETE:
                    if item.kv.key == CONTROLLER:
                        self.active = None
                else:
                    self._on_key(item.kv)
        finally:
            await watch.cancel()

    def _on_key(self, kv: KeyValue) -> None:
        try:
            if kv.key == CONTROLLER:
                self.active = ControllerRecord.decode(kv.value)
                self._manager.observe_controller_epoch(self.active.epoch)
            elif kv.key == CONTROLLER_EPOCH:
                self._manager.observe_controller_epoch(decode_controller_epoch(kv.value))
        except ValueError as exc:
            log.warning("ignoring a malformed %s key: %s", kv.key, exc)

    # ---- AlterPartition --------------------------------------------------------------------------

    def submit(self, partition: Partition, new_isr: tuple[int, ...]) -> None:
        self._queued[partition.key] = (partition, new_isr)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._queued = list(self._queued.values()), {}
        if batch:
            task = asyncio.create_task(self._send(batch), name="alter-partition")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Partition, tuple[int, ...]]]) -> None:
        sent = []
        for partition, isr in batch:
            state = partition.state
            if state is None:
                continue
            sent.append((partition, isr, state))
        request = pb.AlterPartitionRequest(
            node_id=self._manager.node_id,
            partitions=[
                pb.PartitionIsrChange(
                    topic=state.topic,
                    partition=state.partition,
                    leader_epoch=state.leader_epoch,
                    partition_version=state.version,
                    new_isr=list(isr),
                )
                for _, isr, state in sent
            ],
        )
        try:
            response = await self._stub().AlterPartition(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            self._fail(sent, errors.error_from_rpc(exc))
            return
        except errors.TributaryError as exc:
            self._fail(sent, exc)
            return
        answers = {(r.topic, r.partition): r for r in response.partitions}
        for partition, isr, _ in sent:
            answer = answers.get(partition.key)
            error = (
                error_from_proto(answer.error) if answer is not None and answer.HasField("error") else None
            )
            if answer is None or error is not None:
                partition.on_isr_change_failed(isr, error or errors.UnknownServerError("no answer"))
                continue
            try:
                partition.apply_state(leader_and_isr_from_proto(answer.state))
            except errors.TributaryError as exc:
                partition.on_isr_change_failed(isr, exc)

    async def controlled_shutdown(
        self, broker_epoch: int, wait_s: float
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Ask the active controller to move leadership and ISR membership off this node
        (ControlledShutdown); ``(remaining, kept)`` as it answers after up to ``wait_s``.
        Raises the typed error of a failed call (retriable when the controller could not be
        reached)."""
        request = pb.ControlledShutdownRequest(
            node_id=self._manager.node_id, broker_epoch=broker_epoch, wait_ms=max(1, int(wait_s * 1000))
        )
        try:
            response = await self._stub().ControlledShutdown(request, timeout=wait_s + self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise errors.error_from_rpc(exc) from exc
        return (
            [(tp.topic, tp.partition) for tp in response.remaining],
            [(tp.topic, tp.partition) for tp in response.kept],
        )

    async def verify_transaction(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> errors.TributaryError | None:
        """Ask the transaction coordinator whether the producer's transaction is open with this
        partition added (KIP-890); None if it is, else why not (retriable when the coordinator
        could not be asked)."""
        request = pb.VerifyTxnPartitionsRequest(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            partitions=[pb.TopicPartition(topic=topic, partition=partition)],
        )
        try:
            response = await self._stub().VerifyTxnPartitions(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            error = errors.error_from_rpc(exc)
            if not error.retriable:
                return error
            return errors.CoordinatorNotAvailableError(f"the transaction could not be verified: {error}")
        except errors.TributaryError as exc:
            return exc
        for result in response.results:
            if result.HasField("error"):
                return error_from_proto(result.error) or errors.UnknownServerError("no reason given")
        return None

    @staticmethod
    def _fail(sent, error: errors.TributaryError) -> None:
        for partition, isr, _ in sent:
            partition.on_isr_change_failed(isr, error)

    def _stub(self) -> coordinator_grpc.CoordinatorStub:
        active = self.active
        if active is None or not active.address:
            raise errors.CoordinatorNotAvailableError("no active controller is known")
        rotated = self._rotation.rotated()  # a new channel presents the new certificate
        if self._channel is None or self._channel[0] != active.address or rotated:
            if self._channel is not None:
                retire_channels([self._channel[1]])
            self._channel = (
                active.address,
                aio_channel(active.address, self._tls, options=INTERNAL_CHANNEL_OPTIONS),
            )
        return coordinator_grpc.CoordinatorStub(self._channel[1])
