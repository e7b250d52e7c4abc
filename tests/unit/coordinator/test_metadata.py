"""The metadata state and cache: applying etcd snapshots and events, and the served views."""

import asyncio
import json

import pytest

from coordinator import keys
from coordinator.metadata import MetadataCache, MetadataState
from coordinator.model import (
    ControllerInfo,
    CoordinatorInfo,
    PartitionRecord,
    PartitionStatus,
    TopicRecord,
)
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync

_revision = iter(range(100, 10_000))


def kv(key, value, *, create=None, mod=None, lease=0):
    mod = mod or next(_revision)
    return KeyValue(key, value if isinstance(value, bytes) else value.encode(), create or mod, mod, 1, lease)


def broker(node_id, rack="", *, create=None):
    value = json.dumps(
        {
            "node_id": node_id,
            "host": "127.0.0.1",
            "grpc_port": 9000 + node_id,
            "fetch_port": 9100 + node_id,
            "rack": rack,
        }
    )
    return kv(keys.broker_key(node_id), value, create=create)


def topic(name, assignment, **extra):
    record = TopicRecord(
        name,
        "id-" + name,
        len(assignment[0]),
        extra.pop("configs", {}),
        tuple(tuple(r) for r in assignment),
        **extra,
    )
    return kv(keys.topic_key(name), keys.encode_topic(record))


def partition(name, p, leader, status=PartitionStatus.ONLINE, *, replicas=None, epoch=0, isr=None):
    record = PartitionRecord(tuple(replicas or (leader,)), leader, epoch, tuple(isr or (leader,)), status)
    return kv(keys.partition_key(name, p), keys.encode_partition(record))


def put(item):
    return WatchEvent(EventType.PUT, item)


def delete(key):
    return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, next(_revision), 0))


def snapshot(*kvs, revision=50):
    return WatchResync(tuple(kvs), revision)


def test_snapshot_builds_everything():
    state = MetadataState()
    state.apply_resync(
        snapshot(
            broker(1, "r1"),
            broker(2, "r2"),
            kv(keys.coordinator_key("c1"), keys.encode_coordinator(CoordinatorInfo("c1", "h", 5))),
            kv(keys.CONTROLLER, keys.encode_controller(ControllerInfo("c1", "h:5", 3))),
            kv(keys.CONTROLLER_EPOCH, "3"),
            kv(keys.CLUSTER_ID, "abc"),
            topic("orders", [[1, 2], [2, 1]], configs={"retention.ms": "1000"}),
            partition("orders", 0, 1, replicas=(1, 2)),
            revision=77,
        )
    )
    assert sorted(state.brokers) == [1, 2] and state.brokers[1].rack == "r1"
    assert state.coordinators["c1"].address == "h:5"
    assert state.controller == ControllerInfo("c1", "h:5", 3)
    assert state.controller_epoch == 3 and state.cluster_id == "abc"
    assert state.revision == 77
    view = state.topic_view("orders")
    assert view.configs == {"retention.ms": "1000"}
    assert [p.status for p in view.partitions] == [PartitionStatus.ONLINE, PartitionStatus.PENDING]
    assert view.partitions[0].leader == 1 and view.partitions[1].leader == -1
    assert view.partitions[1].replicas == (2, 1)


def test_lease_expiry_of_the_leader_shows_offline_at_once():
    state = MetadataState()
    state.apply_resync(
        snapshot(broker(1), broker(2), topic("t", [[1], [2]]), partition("t", 0, 1), partition("t", 1, 2))
    )
    state.apply_events([delete(keys.broker_key(1))])
    view = state.topic_view("t")
    assert view.partitions[0].status is PartitionStatus.OFFLINE and view.partitions[0].leader == -1
    assert view.partitions[1].status is PartitionStatus.ONLINE
    # The node coming back does not make it ONLINE: only the controller's write does.
    state.apply_events([put(partition("t", 0, 1, PartitionStatus.OFFLINE, epoch=1))])
    state.apply_events([put(broker(1))])
    assert state.topic_view("t").partitions[0].status is PartitionStatus.OFFLINE
    state.apply_events([put(partition("t", 0, 1, PartitionStatus.ONLINE, epoch=2))])
    assert state.topic_view("t").partitions[0].status is PartitionStatus.ONLINE
    assert state.topic_view("t").partitions[0].leader_epoch == 2


def test_events_track_revision_and_deletions():
    state = MetadataState()
    state.apply_resync(
        snapshot(
            topic("a", [[1]]),
            partition("a", 0, 1),
            kv(keys.CONTROLLER, keys.encode_controller(ControllerInfo("c", "h:1", 1))),
        )
    )
    event = delete(keys.CONTROLLER)
    state.apply_events([event])
    assert state.controller is None and state.revision == event.revision
    state.apply_events([delete(keys.topic_key("a")), delete(keys.partition_key("a", 0))])
    assert state.topics == {} and state.partitions == {}
    assert state.topic_view("a") is None


def test_topics_being_deleted_are_hidden():
    state = MetadataState()
    state.apply_resync(snapshot(topic("keep", [[1]]), topic("gone", [[1]], deleting=True)))
    assert state.topic_names() == ["keep"]
    assert state.topic_view("gone") is None and state.live_topic("gone") is None
    assert "gone" in state.topics  # still there for the controller to finish deleting


def test_resync_replaces_instead_of_merging():
    state = MetadataState()
    state.apply_resync(snapshot(broker(1), topic("old", [[1]])))
    state.apply_resync(snapshot(broker(2), revision=90))
    assert list(state.brokers) == [2] and state.topics == {} and state.revision == 90


@pytest.mark.parametrize("bad", [b"not json", b"[1,2]", b'{"assignment": []}', b'{"assignment": [["x"]]}'])
def test_a_corrupt_value_is_skipped_not_fatal(bad):
    state = MetadataState()
    state.apply_resync(snapshot(kv(keys.topic_key("bad"), bad), topic("good", [[1]])))
    assert state.topic_names() == ["good"]


def test_a_corrupt_rewrite_drops_the_old_value():
    state = MetadataState()
    state.apply_resync(snapshot(topic("t", [[1]])))
    state.apply_events([put(kv(keys.topic_key("t"), b"{garbage"))])
    assert state.topic_names() == []


def test_broker_incarnation_is_the_create_revision():
    state = MetadataState()
    state.apply_resync(snapshot(broker(1, create=10)))
    state.apply_events([delete(keys.broker_key(1)), put(broker(1, create=20))])
    assert state.brokers[1].incarnation == 20


def test_leader_counts_and_racks():
    state = MetadataState()
    state.apply_resync(snapshot(broker(1, "a"), broker(2, "b"), topic("t", [[1, 2], [2, 1], [1, 2]])))
    assert state.leader_counts() == {1: 2, 2: 1}
    assert state.live_racks() == {1: "a", 2: "b"}


def test_parse_key_shapes():
    assert keys.parse_key("topics/a.b/partitions/3") == keys.ParsedKey("partition", "a.b", 3)
    assert keys.parse_key("topics/a.b") == keys.ParsedKey("topic", "a.b")
    assert keys.parse_key("topics/a/partitions/x").kind == "other"
    assert keys.parse_key("brokers/7") == keys.ParsedKey("broker", "7")
    assert keys.parse_key("controller").kind == "controller"
    assert keys.parse_key("groups/g/members/m").kind == "other"


def test_value_round_trips():
    record = TopicRecord("t", "x", 2, {"a": "b"}, ((1, 2), (2, 1)), deleting=True)
    decoded = keys.decode_topic("t", keys.encode_topic(record), mod_revision=5)
    assert decoded == TopicRecord("t", "x", 2, {"a": "b"}, ((1, 2), (2, 1)), True, 5)
    state = PartitionRecord((1, 2), 1, 4, (1,), PartitionStatus.OFFLINE)
    assert keys.decode_partition(keys.encode_partition(state)) == state
    assert keys.decode_epoch(keys.encode_epoch(12)) == 12
    with pytest.raises(keys.BadValueError):
        keys.decode_epoch(b"-1")


def test_cache_waits_for_revision_and_notifies_listeners():
    asyncio.run(_cache_waits())


async def _cache_waits():
    cache = MetadataCache()
    calls = []
    cache.add_listener(lambda: calls.append(cache.revision))
    assert not await cache.wait_for_revision(1, 0.05)  # not synced yet
    cache.apply(snapshot(broker(1), revision=10))
    assert cache.synced and calls == [10]
    waiter = asyncio.create_task(cache.wait_for_revision(200_000, 2.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    cache.apply([WatchEvent(EventType.PUT, kv(keys.CLUSTER_ID, "x", mod=200_000))])
    assert await waiter
    assert calls[-1] == 200_000


def test_topics_changed_since_reads_the_changes_newest_first():
    state = MetadataState()
    at = next(_revision)
    state.apply_resync(snapshot(broker(1), topic("a", [[1]]), topic("b", [[1]]), revision=at))
    assert set(state.topics_changed_since(at - 1)) == {"a", "b"}
    assert state.topics_changed_since(at) == []
    put_a = put(partition("a", 0, 1))
    state.apply_events([put_a])
    put_c = put(topic("c", [[1]]))
    state.apply_events([put_c])
    assert state.topics_changed_since(at) == ["c", "a"]
    assert state.topics_changed_since(put_a.revision) == ["c"]
    removal = delete(keys.topic_key("b"))
    state.apply_events([removal])
    assert state.topics_changed_since(put_c.revision) == ["b"]  # a tombstone: b is gone
    assert state.live_topic("b") is None
    # Group keys move the revision but change no topic.
    state.apply_events([put(kv("groups/g/members/m", "{}"))])
    assert state.topics_changed_since(removal.revision) == []


def test_a_delta_is_possible_only_without_a_snapshot_or_broker_change_since():
    state = MetadataState()
    at = next(_revision)
    state.apply_resync(snapshot(broker(1), topic("a", [[1]]), revision=at))
    assert not state.delta_possible_since(at - 1)  # before the snapshot: anything may differ
    event = put(partition("a", 0, 1))
    state.apply_events([event])
    assert state.delta_possible_since(at)
    node = put(broker(2))
    state.apply_events([node])
    assert not state.delta_possible_since(event.revision)  # every partition's view may differ
    assert state.delta_possible_since(node.revision)


def test_changed_partitions_name_only_the_states_written_since_unless_the_topic_changed():
    state = MetadataState()
    kvs = (broker(1), topic("a", [[1], [1], [1]]), partition("a", 0, 1), partition("a", 2, 1))
    at = next(_revision)  # the snapshot's revision: after every key in it
    state.apply_resync(snapshot(*kvs, revision=at))
    record = state.topics["a"]
    assert state.changed_partitions(record, at) == []
    first = put(partition("a", 1, 1))
    state.apply_events([first, put(partition("a", 2, 1, epoch=1))])
    assert state.changed_partitions(record, at) == [1, 2]
    assert state.changed_partitions(record, first.revision) == [2]
    view = state.partial_topic_view(record, [2])
    assert view.partial and [(p.partition, p.leader_epoch) for p in view.partitions] == [(2, 1)]
    # The topic's own key rewritten (configs, partition count): the whole topic is due.
    regrown = put(topic("a", [[1], [1], [1], [1]]))
    state.apply_events([regrown])
    assert state.changed_partitions(state.topics["a"], at) is None
    assert state.changed_partitions(state.topics["a"], regrown.revision) == []
    # A partition state deleted: no mod revision shows it, so the whole topic is due too.
    removal = delete(keys.partition_key("a", 0))
    state.apply_events([removal])
    assert state.changed_partitions(state.topics["a"], regrown.revision) is None
    assert state.changed_partitions(state.topics["a"], removal.revision) == []
