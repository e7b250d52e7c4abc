"""The writer's input contract, the topic option over the column, and best-effort group commits."""

import logging
from concurrent import futures

import grpc
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from gateway.client.structs import TopicPartition
from services.proto import gateway_grpc, pb
from services.records import Compression
from spark_jobs.group_offsets import GroupOffsets
from spark_jobs.options import WriteOptions
from spark_jobs.schema import HEADER_TYPE
from spark_jobs.sink import WriteSchemaError, ensure_writable
from spark_jobs.sink_batches import plan_batches


def schema(**columns) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])


def test_value_is_required():
    with pytest.raises(WriteSchemaError, match="needs a 'value' column"):
        ensure_writable(schema(key=BinaryType()), WriteOptions(topic="t"))


@pytest.mark.parametrize(
    "column, kind, fragment",
    [
        pytest.param("value", LongType(), "'value' must be binary or string", id="value"),
        pytest.param("partition", LongType(), "'partition' must be int", id="partition"),
        pytest.param("headers", ArrayType(StringType()), "'headers' must be array<struct", id="headers"),
    ],
)
def test_wrong_types_name_the_column(column, kind, fragment):
    columns = {"value": BinaryType(), column: kind}
    with pytest.raises(WriteSchemaError, match=fragment):
        ensure_writable(schema(**columns), WriteOptions(topic="t"))


def test_a_topic_comes_from_the_option_or_a_column():
    with pytest.raises(WriteSchemaError, match="set the 'topic' option or add a 'topic' column"):
        ensure_writable(schema(value=StringType()), WriteOptions())
    ensure_writable(schema(value=StringType(), topic=StringType()), WriteOptions())
    ensure_writable(
        schema(value=StringType(), key=StringType(), partition=IntegerType(), headers=ArrayType(HEADER_TYPE)),
        WriteOptions(topic="t"),
    )


def test_rows_take_the_topic_option_over_the_column():
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [b"a", None],
            "topic": ["col", "col"],
            "partition": [1, None],
            "headers": [[{"key": "h", "value": b"x"}], None],
        }
    )
    planned = list(plan_batches(batch, "opt", lambda topic: 2, Compression.NONE))
    assert {p.topic for p in planned} == {"opt"}
    assert sum(p.count for p in planned) == 2
    from_column = list(plan_batches(batch, None, lambda topic: 2, Compression.NONE))
    assert {p.topic for p in from_column} == {"col"}
    assert sum(p.count for p in from_column) == 2


# ---- group offsets ------------------------------------------------------------------------------


class Groups(gateway_grpc.GatewayServicer):
    def __init__(self):
        self.committed = {}

    def CommitOffsets(self, request, context):
        for o in request.offsets:
            self.committed[(o.topic, o.partition)] = (o.offset, request.member_id, request.generation_id)
        return pb.CommitOffsetsResponse(
            results=[pb.OffsetCommitResult(topic=o.topic, partition=o.partition) for o in request.offsets]
        )

    def FetchCommittedOffsets(self, request, context):
        return pb.FetchCommittedOffsetsResponse(
            offsets=[
                pb.CommittedOffset(topic=t, partition=p, offset=o)
                for (t, p), (o, _, _) in self.committed.items()
            ]
        )


def serve(servicer=None):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if servicer is not None:
        gateway_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_standalone_commit_and_fetch():
    groups = Groups()
    server, address = serve(groups)
    try:
        with GroupOffsets(address, "g") as offsets:
            assert offsets.commit({TopicPartition("t", 0): 42})
            assert groups.committed[("t", 0)] == (42, "", -1)  # standalone: no member, generation -1
            assert offsets.fetch([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 42}
    finally:
        server.stop(None)


def test_commit_is_best_effort_when_the_cluster_does_not_implement_it(caplog):
    server, address = serve()  # no services: every RPC answers UNIMPLEMENTED
    try:
        with caplog.at_level(logging.WARNING), GroupOffsets(address, "g") as offsets:
            assert offsets.commit({TopicPartition("t", 0): 1}) is False
            assert offsets.fetch([TopicPartition("t", 0)]) is None
    finally:
        server.stop(None)
    assert "offsets NOT committed ([UNSUPPORTED_VERSION] UNIMPLEMENTED" in caplog.text
    assert "_offsets manifests remain the source of truth" in caplog.text
