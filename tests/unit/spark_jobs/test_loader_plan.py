"""Where the loader starts each partition: the output's manifests first, then earliest or the group."""

from pathlib import Path
from typing import ClassVar

from gateway.client.structs import TopicPartition
from spark_jobs import loader
from spark_jobs.loader import LoaderConfig, starting_offsets
from spark_jobs.offsets import OffsetRange
from spark_jobs.output_store import OutputStore

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
EARLIEST = {T0: 0, T1: 3, T2: 7}


class FakeGroup:
    asked: ClassVar[list] = []  # every instance's questions, for the test to read

    def __init__(self, servers, group_id, *, security=()):
        self.group_id = group_id

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def fetch(self, tps):
        FakeGroup.asked.append(sorted(tps))
        return {T1: 40}  # T2 has no committed offset


def with_manifest(tmp_path: Path) -> OutputStore:
    store = OutputStore(tmp_path)
    staging = store.staging_dir(0)
    staging.mkdir(parents=True)
    store.commit(0, [OffsetRange("t", 0, 0, 25)], {}, now_ms=1)
    return store


def test_new_partitions_start_at_earliest_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "GroupOffsets", FakeGroup)
    FakeGroup.asked = []
    config = LoaderConfig(servers="h:1", topics=("t",), output=tmp_path)
    assert starting_offsets(with_manifest(tmp_path), config, [T0, T1, T2], EARLIEST) == {T0: 25, T1: 3, T2: 7}
    assert FakeGroup.asked == []  # the group is not even asked


def test_start_from_group_uses_committed_offsets_where_the_output_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "GroupOffsets", FakeGroup)
    FakeGroup.asked = []
    config = LoaderConfig(servers="h:1", topics=("t",), output=tmp_path, start_from="group")
    started = starting_offsets(with_manifest(tmp_path), config, [T0, T1, T2], EARLIEST)
    assert started == {T0: 25, T1: 40, T2: 7}
    assert FakeGroup.asked == [[T1, T2]]  # the manifest wins for T0
