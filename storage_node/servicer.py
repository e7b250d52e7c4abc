"""The StorageNode gRPC servicer: translation between protobuf and :mod:`storage_node.handlers`."""

from __future__ import annotations

import asyncio

from services import errors
from services.broker_address import BrokerAddress
from services.grpc_server import translate_errors
from services.proto import pb, storage_grpc
from services.serde import (
    acks_from_proto,
    append_result_to_proto,
    error_to_proto,
    leader_and_isr_from_proto,
    offset_spec_from_proto,
)
from storage_node.handlers import CreationRequest, OffsetResult, StorageNodeHandlers, TxnMarker
from storage_node.log.cleaner.cleaner import plan as cleaner_plan

#: Deadline of an acks=all append whose request sets none.
_DEFAULT_TIMEOUT_MS = 30_000
#: Partitions one CreatePartitionBatch may name (the controller sends 1,000).
MAX_CREATE_BATCH = 10_000


def _offset_result_to_proto(result: OffsetResult):
    return pb.PartitionOffsetResult(
        topic=result.topic,
        partition=result.partition,
        offset=result.offset,
        timestamp=result.timestamp,
        error=error_to_proto(result.error) if result.error else None,
    )


def _partition_info_to_proto(
    topic: str, partition: int, partition_log, log_dir: str = "", state=None, cleaner=None
):
    return pb.PartitionLogInfo(
        topic=topic,
        partition=partition,
        size_bytes=partition_log.size_in_bytes,
        log_start_offset=partition_log.log_start_offset,
        log_end_offset=partition_log.log_end_offset,
        high_watermark=partition_log.high_watermark,
        segment_count=partition_log.segment_count,
        log_dir=log_dir,
        recovery_point=partition_log.recovery_point,
        leader=state.leader if state is not None else -1,
        leader_epoch=state.leader_epoch if state is not None else -1,
        isr=list(state.isr) if state is not None else [],
        state_version=state.version if state is not None else 0,
        latest_log_epoch=partition_log.latest_epoch,
        cleaner=cleaner,
    )


def _cleaner_progress(partition_log) -> pb.CleanerProgress | None:
    """The cleaner's split of a compacted partition, computed now (segment facts and one small
    checkpoint read); None for a partition that is not compacted."""
    if not partition_log.config.compact_enabled or partition_log.closed:
        return None
    part = cleaner_plan(partition_log, partition_log.clock.time_ms())
    return pb.CleanerProgress(
        dirty_ratio=part.dirty_ratio,
        first_dirty_offset=part.first_dirty,
        first_uncleanable_offset=part.first_uncleanable,
        clean_bytes=part.clean_bytes,
        dirty_bytes=part.dirty_bytes,
    )


class StorageNodeServicer(storage_grpc.StorageNodeServicer):
    def __init__(self, handlers: StorageNodeHandlers, node_id: int, *, fetch_stats=None) -> None:
        self._handlers = handlers
        self._node_id = node_id
        self._fetch_stats = fetch_stats

    @translate_errors
    async def Append(self, request, context):
        acks = acks_from_proto(request.acks)
        if request.timeout_ms < 0:
            raise errors.InvalidRequestError(f"timeout_ms {request.timeout_ms} is negative")
        timeout_s = (request.timeout_ms or _DEFAULT_TIMEOUT_MS) / 1000
        results = await asyncio.gather(
            *(
                self._handlers.append(
                    p.topic,
                    p.partition,
                    p.record_batches,
                    acks=acks,
                    timeout_s=timeout_s,
                    leader_epoch=p.leader_epoch if p.HasField("leader_epoch") else None,
                )
                for p in request.partitions
            )
        )
        return pb.AppendResponse(partitions=[append_result_to_proto(r) for r in results])

    @translate_errors
    async def ListPartitionOffsets(self, request, context):
        results = []
        for query in request.partitions:
            try:
                timestamp = offset_spec_from_proto(query.spec)
            except errors.TributaryError as exc:
                results.append(OffsetResult(query.topic, query.partition, error=exc))
                continue
            results.append(
                self._handlers.list_offset(
                    query.topic, query.partition, timestamp=timestamp, read_committed=request.read_committed
                )
            )
        return pb.ListPartitionOffsetsResponse(partitions=[_offset_result_to_proto(r) for r in results])

    @translate_errors
    async def CreatePartition(self, request, context):
        if not request.topic or request.partition < 0:
            raise errors.InvalidRequestError("create partition needs a topic and a partition >= 0")
        partition_log = await self._handlers.create_partition(
            request.topic,
            request.partition,
            dict(request.configs),
            controller_epoch=request.controller_epoch,
            leader_epoch=request.leader_epoch,
            must_exist=request.must_exist,
        )
        return pb.CreatePartitionResponse(
            log_dir=str(partition_log.directory.parent), log_end_offset=partition_log.log_end_offset
        )

    @translate_errors
    async def CreatePartitionBatch(self, request, context):
        if len(request.partitions) > MAX_CREATE_BATCH:
            raise errors.InvalidRequestError(
                f"{len(request.partitions)} partitions in one call, at most {MAX_CREATE_BATCH}"
            )
        creations = []
        for r in request.partitions:
            if not r.topic or r.partition < 0:
                raise errors.InvalidRequestError("create partition needs a topic and a partition >= 0")
            creations.append(
                CreationRequest(
                    r.topic, r.partition, dict(r.configs), r.controller_epoch, r.leader_epoch, r.must_exist
                )
            )
        outcomes = await self._handlers.create_partitions(creations)
        return pb.CreatePartitionBatchResponse(
            partitions=[
                pb.CreatePartitionResult(topic=c.topic, partition=c.partition, error=error_to_proto(outcome))
                if isinstance(outcome, errors.TributaryError)
                else pb.CreatePartitionResult(
                    topic=c.topic,
                    partition=c.partition,
                    log_dir=str(outcome.log_dir),
                    log_end_offset=outcome.log_end_offset,
                )
                for c, outcome in zip(creations, outcomes, strict=True)
            ]
        )

    @translate_errors
    async def DeletePartition(self, request, context):
        self._handlers.delete_partition(
            request.topic, request.partition, controller_epoch=request.controller_epoch
        )
        return pb.DeletePartitionResponse()

    @translate_errors
    async def WriteTxnMarkers(self, request, context):
        markers = [
            TxnMarker(
                m.producer_id,
                m.producer_epoch,
                m.commit,
                m.coordinator_epoch,
                tuple((tp.topic, tp.partition) for tp in m.partitions),
            )
            for m in request.markers
        ]
        remaining = context.time_remaining()
        timeout_s = max(0.001, (30.0 if remaining is None else remaining) - 0.05)
        outcomes = await self._handlers.write_txn_markers(markers, timeout_s=timeout_s)
        by_producer: dict[int, list] = {}
        for producer_id, topic, partition, error in outcomes:
            by_producer.setdefault(producer_id, []).append(
                pb.PartitionError(
                    topic=topic, partition=partition, error=error_to_proto(error) if error else None
                )
            )
        return pb.WriteTxnMarkersResponse(
            markers=[
                pb.TxnMarkerResult(producer_id=pid, results=results) for pid, results in by_producer.items()
            ]
        )

    @translate_errors
    async def UpdateLeaderAndIsr(self, request, context):
        states = [leader_and_isr_from_proto(p) for p in request.partitions]
        leaders = {
            e.node_id: BrokerAddress(e.node_id, e.host, fetch_port=e.fetch_port) for e in request.leaders
        }
        configs = {topic: dict(c.configs) for topic, c in request.topic_configs.items()}
        results = self._handlers.update_leader_and_isr(request.controller_epoch, states, leaders, configs)
        return pb.UpdateLeaderAndIsrResponse(
            partitions=[
                pb.LeaderAndIsrResult(
                    topic=r.topic, partition=r.partition, error=error_to_proto(r.error) if r.error else None
                )
                for r in results
            ]
        )

    @translate_errors
    async def DeleteRecords(self, request, context):
        start = self._handlers.delete_records(request.topic, request.partition, request.before_offset)
        return pb.DeletePartitionRecordsResponse(log_start_offset=start)

    @translate_errors
    async def DescribeLogDirs(self, request, context):
        dirs = []
        for info in self._handlers.logs.describe_log_dirs():
            dirs.append(
                pb.LogDirInfo(
                    path=str(info.path),
                    total_bytes=info.total_bytes,
                    free_bytes=info.free_bytes,
                    partitions=[
                        _partition_info_to_proto(p.topic, p.partition, p, str(info.path))
                        for p in info.partitions
                    ],
                )
            )
        return pb.DescribeLogDirsResponse(node_id=self._node_id, log_dirs=dirs, traffic=self._traffic())

    def _role(self, topic: str, partition: int):
        try:
            return self._handlers.replicas.get(topic, partition).state
        except errors.TributaryError:
            return None

    def _traffic(self):
        handlers = self._handlers
        stats = self._fetch_stats() if self._fetch_stats else None
        return pb.NodeTraffic(
            bytes_in=handlers.bytes_in,
            records_in=handlers.records_in,
            append_requests=handlers.append_requests,
            bytes_out=(stats.sendfile_bytes + stats.copied_bytes) if stats else 0,
            fetch_requests=stats.requests if stats else 0,
            fetch_connections=stats.connections if stats else 0,
            fetch_connections_refused=stats.connections_refused if stats else 0,
            fetch_polls_cancelled=stats.polls_cancelled if stats else 0,
            fetch_waits_capped=stats.waits_capped if stats else 0,
            data_port_appends=stats.appends if stats else 0,
            data_port_append_connections=stats.append_connections if stats else 0,
            data_port_append_errors=stats.append_errors if stats else 0,
            fetch_tls_handshakes=stats.tls_handshakes if stats else 0,
            fetch_tls_handshake_failures=stats.tls_handshake_failures if stats else 0,
        )

    @translate_errors
    async def DescribePartitions(self, request, context):
        wanted = {(tp.topic, tp.partition) for tp in request.partitions}
        infos = []
        for partition_log in self._handlers.logs.partitions():
            key = (partition_log.topic, partition_log.partition)
            if wanted and key not in wanted:
                continue
            infos.append(
                _partition_info_to_proto(
                    *key,
                    partition_log,
                    str(partition_log.directory.parent),
                    self._role(*key),
                    _cleaner_progress(partition_log),
                )
            )
        missing = wanted - {(i.topic, i.partition) for i in infos}
        if missing:
            topic, partition = sorted(missing)[0]
            raise errors.UnknownTopicOrPartitionError(f"{topic}-{partition} is not on node {self._node_id}")
        return pb.DescribePartitionsResponse(node_id=self._node_id, partitions=infos)
