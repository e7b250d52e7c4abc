"""The loader's output protocol: staged -> committed (manifest) -> published, and recovery at each point."""

import json

import pytest

from gateway.client.structs import TopicPartition
from spark_jobs.faults import CRASH_EXIT_CODE, LOADER_POINTS, maybe_crash_after
from spark_jobs.offsets import OffsetRange
from spark_jobs.output_store import Manifest, OutputCorruptError, OutputStore

RANGES = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 5)]
FILES = ["date=2026-01-01/hour=00/part-0.parquet", "date=2026-01-01/hour=01/part-1.parquet"]


def stage(store: OutputStore, batch_id: int, files=FILES) -> dict[str, int]:
    """Files as Spark leaves them: data, a _SUCCESS marker and hidden .crc checksums."""
    staging = store.staging_dir(batch_id)
    for _i, relative in enumerate(files):
        path = staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{batch_id}:{relative}".encode())
        (path.parent / f".{path.name}.crc").write_bytes(b"crc")
    (staging / "_SUCCESS").write_bytes(b"")
    return {relative: 3 + i for i, relative in enumerate(files)}


def published(store: OutputStore) -> list[str]:
    return [str(p.relative_to(store.root)) for p in store.published_files()]


def test_commit_writes_a_manifest_naming_data_files_and_offsets(tmp_path):
    store = OutputStore(tmp_path)
    manifest = store.commit(0, RANGES, stage(store, 0), now_ms=123)
    assert manifest.files == tuple(FILES) and manifest.records == 7
    assert manifest.by_directory == {"date=2026-01-01/hour=00": 3, "date=2026-01-01/hour=01": 4}
    on_disk = json.loads(store.manifest_path(0).read_text())
    assert on_disk["offsets"] == {"t": {"0": [0, 10], "1": [5, 5]}}
    assert Manifest.from_json(on_disk) == manifest
    assert not list(store.offsets_dir.glob(".*"))  # no temporary left behind
    assert published(store) == []  # committed is not yet published


def test_publish_moves_files_into_place_and_removes_staging(tmp_path):
    store = OutputStore(tmp_path)
    manifest = store.commit(0, RANGES, stage(store, 0), now_ms=1)
    assert store.publish(manifest) == 2
    assert published(store) == FILES
    assert not store.staging_dir(0).exists()
    assert store.publish(manifest) == 0  # idempotent


def test_recovery_discards_a_batch_that_was_never_committed(tmp_path):
    store = OutputStore(tmp_path)
    stage(store, 0)  # crash after "write"
    actions = store.recover()
    assert "discarded" in actions[0]
    assert not store.staging_dir(0).exists() and published(store) == [] and store.next_batch_id() == 0


def test_recovery_finishes_a_committed_batch(tmp_path):
    store = OutputStore(tmp_path)
    store.commit(0, RANGES, stage(store, 0), now_ms=1)  # crash after "manifest"
    assert "publish finished (2 files moved)" in store.recover()[0]
    assert published(store) == FILES


def test_recovery_finishes_a_half_done_publish(tmp_path):
    store = OutputStore(tmp_path)
    manifest = store.commit(0, RANGES, stage(store, 0), now_ms=1)
    first = store.root / FILES[0]
    first.parent.mkdir(parents=True)
    (store.staging_dir(0) / FILES[0]).rename(first)  # crash between two renames
    assert "1 files moved" in store.recover()[0]
    assert published(store) == FILES
    assert store.manifests() == [manifest]


def test_a_manifest_naming_a_vanished_file_is_reported(tmp_path):
    store = OutputStore(tmp_path)
    manifest = store.commit(0, RANGES, stage(store, 0), now_ms=1)
    (store.staging_dir(0) / FILES[1]).unlink()
    with pytest.raises(OutputCorruptError, match=r"part-1\.parquet is neither staged nor published"):
        store.publish(manifest)


def test_next_batches_start_where_the_manifests_end(tmp_path):
    store = OutputStore(tmp_path)
    store.publish(store.commit(0, RANGES, stage(store, 0), now_ms=1))
    later = [OffsetRange("t", 0, 10, 15)]  # partition 1 had nothing new and was not planned
    counts = stage(store, 1, ["date=2026-01-01/hour=02/part-2.parquet"])
    store.publish(store.commit(1, later, counts, now_ms=2))
    assert store.next_batch_id() == 2
    assert store.committed_offsets() == {TopicPartition("t", 0): 15, TopicPartition("t", 1): 5}


def test_fault_points_are_declared_in_one_place(monkeypatch):
    assert LOADER_POINTS == ("write", "manifest", "publish")
    with pytest.raises(ValueError, match="unknown fault-injection point"):
        maybe_crash_after("commit")
    exits = []
    monkeypatch.setattr("os._exit", exits.append)
    maybe_crash_after("write", environ={})
    maybe_crash_after("write", environ={"TRIBUTARY_LOADER_CRASH_AFTER": "manifest"})
    assert exits == []
    maybe_crash_after("manifest", environ={"TRIBUTARY_LOADER_CRASH_AFTER": "manifest"})
    assert exits == [CRASH_EXIT_CODE]
