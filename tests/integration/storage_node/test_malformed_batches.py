"""The hardening issue's malformed batches against a real node: refused at once, nothing stored,
and the node answers other clients within a second while it handles them.

Each case repeats the issue's reproduction (``tests/batch_faults.py``) from a client of its own
while this test's client calls DescribePartitions and fetches (``tests/integration/responsiveness``).
"""

from __future__ import annotations

import grpc
import pytest

from services.proto import pb, storage_grpc
from services.records import iter_batches
from tests import batch_faults
from tests.integration.responsiveness import PROBE_DEADLINE_S, while_repeating

from .conftest import make_batch

CASES = [
    pytest.param(batch_faults.key_past_record, "CORRUPT_MESSAGE", "record 0 has key length 40", id="key"),
    pytest.param(batch_faults.million_headers, "CORRUPT_MESSAGE", "record 0 has header count", id="headers"),
    pytest.param(
        batch_faults.duplicate_offset_deltas, "CORRUPT_MESSAGE", "record 1 has offset delta 0", id="deltas"
    ),
    pytest.param(batch_faults.decompression_bomb, "CORRUPT_MESSAGE", "exceeds 67108864 bytes", id="bomb"),
    pytest.param(
        batch_faults.transactional_without_producer_id,
        "INVALID_RECORD",
        "transactional and has no producer id",
        id="transactional-without-producer-id",
    ),
    pytest.param(batch_faults.control, "INVALID_RECORD", "control batch", id="control"),
    pytest.param(
        batch_faults.idempotent,
        "INVALID_RECORD",
        "must all come from that one producer",
        id="idempotent-mixed",
    ),
    pytest.param(
        batch_faults.producer_id_without_epoch,
        "INVALID_RECORD",
        "invalid producer epoch -1",
        id="epoch-minus-one",
    ),
]


@pytest.mark.parametrize("build, reason, message", CASES)
def test_a_malformed_batch_is_refused_fast_and_the_node_keeps_answering(node, build, reason, message):
    node.create("t")
    node.append("t", 0, make_batch([b"a", b"b"]))
    bad = make_batch([b"good-before"]) + build()  # one payload: the good batch must not be kept
    sender = grpc.insecure_channel(f"127.0.0.1:{node.process.info['grpc_port']}")
    stub = storage_grpc.StorageNodeStub(sender)

    def append_bad():
        request = pb.AppendRequest(
            partitions=[pb.PartitionAppend(topic="t", partition=0, record_batches=bad)]
        )
        return stub.Append(request, timeout=30).partitions[0]

    def probe():
        assert node.describe("t").log_end_offset == 2
        assert node.fetch("t", 0, 0).header.high_watermark == 2

    try:
        observed = while_repeating(append_bad, probe, min_answers=3)
    finally:
        sender.close()
    for seconds, answer in observed.answers:
        assert answer.error.reason == reason, answer
        assert message in answer.error.message and "batch at byte " in answer.error.message
        assert seconds < PROBE_DEADLINE_S
    assert observed.slowest_probe < PROBE_DEADLINE_S
    # Nothing of any refused payload was stored; the log takes good appends at the next offset.
    stored = node.fetch("t", 0, 0, max_bytes=1 << 20).records
    assert [r.value for b in iter_batches(stored) for r in b.records()] == [b"a", b"b"]
    assert node.append("t", 0, make_batch([b"c"])).base_offset == 2


def test_the_issues_huge_zstd_batch_is_validated_and_stored(node):
    # Valid: 3 million records in ~2.4 MB of zstd, every one walked (in C) before it is stored.
    huge = batch_faults.huge_zstd_batch()
    node.create("huge", **{"max.message.bytes": str(4 << 20)})
    observed = while_repeating(
        lambda: node.append("huge", 0, huge), lambda: node.describe("huge"), min_answers=2
    )
    for seconds, answer in observed.answers:
        assert not answer.HasField("error"), answer
        assert answer.last_offset - answer.base_offset == 2_999_999
        assert seconds < PROBE_DEADLINE_S
    assert observed.slowest_probe < PROBE_DEADLINE_S
