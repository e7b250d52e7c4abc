"""Partition limits, on real clusters (regression for the unbounded partition count).

Before the limits, ``CreateTopic(partitions=1_000_000, validate_only=True)`` kept the active
coordinator's event loop busy ~14 s placing a million partitions: its lease lapsed, it lost the
controllership, and its memory grew by ~800 MiB for good; a real create failed only at etcd's
request size limit and was answered as retriable COORDINATOR_NOT_AVAILABLE, so clients retried
it. Now such requests are refused before any placement, the largest allowed request is placed
off the event loop, and a write etcd refuses as too large is answered as not retriable.
"""

from __future__ import annotations

import time

import pytest

from services import errors
from services.proto import pb
from tests.support.names import unique

from ._cluster import Responsiveness, call, partitions_by_state

MILLION = 1_000_000
INT32_MAX = 2**31 - 1


def _controller(cluster) -> tuple[str, int]:
    info = call(cluster.stub().GetControllerInfo, pb.GetControllerInfoRequest(), timeout=2)
    return info.active_id, info.controller_epoch


def _timed(method, request):
    """(the typed error the call failed with, or None; seconds it took)."""
    started = time.monotonic()
    try:
        call(method, request, timeout=10)
        error = None
    except errors.TributaryError as exc:
        error = exc
    return error, time.monotonic() - started


def test_a_million_partitions_is_refused_at_once_and_the_controller_keeps_serving(shared_cluster):
    cluster = shared_cluster
    before = _controller(cluster)
    existing = unique("grow")
    call(cluster.stub().CreateTopic, pb.CreateTopicRequest(name=existing, partitions=2))
    bad_requests = [
        (
            cluster.stub().CreateTopic,
            pb.CreateTopicRequest(name=unique("m"), partitions=MILLION, validate_only=True),
        ),
        (cluster.stub().CreateTopic, pb.CreateTopicRequest(name=unique("m"), partitions=MILLION)),
        (cluster.stub().CreateTopic, pb.CreateTopicRequest(name=unique("m"), partitions=INT32_MAX)),
        (
            cluster.stub().CreatePartitions,
            pb.CreatePartitionsRequest(topic=existing, total_count=MILLION, validate_only=True),
        ),
        (cluster.stub().CreatePartitions, pb.CreatePartitionsRequest(topic=existing, total_count=INT32_MAX)),
    ]
    # Another client's admin call on the active controller: it goes through the same event loop.
    other_client = cluster.stub(before[0])

    def probe(deadline: float) -> None:
        request = pb.CreateTopicRequest(name=unique("probe"), partitions=1, validate_only=True)
        other_client.CreateTopic(request, timeout=deadline)

    with Responsiveness(probe) as responsiveness:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # keep the bad requests coming for a while
            for method, request in bad_requests:
                error, seconds = _timed(method, request)
                assert isinstance(error, errors.InvalidPartitionsError), error
                assert "max_partitions_per_topic" in error.message and not error.retriable
                assert seconds < 1.0, f"refused only after {seconds:.2f}s"
        # The largest topic allowed (10,000 partitions, replication factor 3) is placed in full.
        started = time.monotonic()
        largest = call(
            cluster.stub().CreateTopic,
            pb.CreateTopicRequest(
                name=unique("largest"), partitions=10_000, replication_factor=3, validate_only=True
            ),
        ).topic
        print(f"\nvalidate-only CreateTopic of 10,000 partitions x RF 3: {time.monotonic() - started:.3f}s")
        assert len(largest.partitions) == 10_000 and all(len(p.replicas) == 3 for p in largest.partitions)
    responsiveness.assert_answered(at_least=20)
    slowest = max(responsiveness.latencies)
    print(f"other client's admin calls: {len(responsiveness.latencies)}, slowest {slowest:.3f}s")

    assert _controller(cluster) == before, "the controller kept its seat (and epoch) throughout"
    names = call(cluster.stub().ListTopics, pb.ListTopicsRequest()).names
    assert not [n for n in names if n.startswith("m-")], "nothing was created"
    grown = cluster.metadata(topics=[existing]).topics[0]
    assert len(grown.partitions) == 2


def test_the_cluster_limit_counts_every_topic_and_growth(make_cluster):
    cluster = make_cluster().start(
        ["c1"],
        [1],
        coordinator_args=("--max-partitions-per-cluster", "10", "--max-partitions-per-topic", "6"),
    )
    cluster.wait_active()
    stub = cluster.stub()
    first = call(stub.CreateTopic, pb.CreateTopicRequest(name="first", partitions=6)).topic
    assert partitions_by_state(first) == {"PARTITION_STATE_ONLINE": list(range(6))}
    with pytest.raises(errors.InvalidPartitionsError, match="more than the 6 a topic may have"):
        call(stub.CreateTopic, pb.CreateTopicRequest(name="seven", partitions=7, validate_only=True))
    with pytest.raises(errors.PolicyViolationError, match="would make 11 in the cluster") as refused:
        call(stub.CreateTopic, pb.CreateTopicRequest(name="five", partitions=5, validate_only=True))
    assert "max_partitions_per_cluster" in refused.value.message and not refused.value.retriable
    call(stub.CreateTopic, pb.CreateTopicRequest(name="second", partitions=3))
    with pytest.raises(errors.PolicyViolationError, match="would make 11"):
        call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic="second", total_count=5))
    grown = call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic="second", total_count=4)).topic
    assert len(grown.partitions) == 4  # exactly at the limit: 6 + 4
    with pytest.raises(errors.PolicyViolationError):
        call(stub.CreateTopic, pb.CreateTopicRequest(name="one-more", partitions=1))
    # A topic being deleted still counts until it is gone; then its partitions are free again.
    call(stub.DeleteTopic, pb.DeleteTopicRequest(name="first"))
    created = call(stub.CreateTopic, pb.CreateTopicRequest(name="third", partitions=6)).topic
    assert len(created.partitions) == 6


def test_a_write_etcd_refuses_as_too_large_is_not_retriable(make_cluster, etcd_factory):
    # An etcd that takes smaller requests than the coordinator's own record limit (1 MiB): the
    # refusal comes from etcd itself, and must not be reported as "try again".
    small_etcd = etcd_factory(extra_args=("--max-request-bytes", "16384"))
    cluster = make_cluster(small_etcd).start(["c1"], [1])
    cluster.wait_active()
    before = _controller(cluster)
    name = unique("too-big")
    error, seconds = _timed(cluster.stub().CreateTopic, pb.CreateTopicRequest(name=name, partitions=5_000))
    assert isinstance(error, errors.PolicyViolationError), error
    assert "larger than etcd accepts" in error.message and not error.retriable
    assert seconds < 5.0
    assert name not in call(cluster.stub().ListTopics, pb.ListTopicsRequest()).names
    assert _controller(cluster) == before
    small = call(cluster.stub().CreateTopic, pb.CreateTopicRequest(name=unique("small"), partitions=2)).topic
    assert partitions_by_state(small) == {"PARTITION_STATE_ONLINE": [0, 1]}
