"""What compaction keeps for idempotence and transactions: the producer headers, each producer's
last batch, transaction markers; and what it removes: records of aborted transactions."""

from __future__ import annotations

from services.records import iter_batches
from tests.unit.storage_node.log_testkit import read_all

from .compaction_kit import clean_fully, compacted_log, keyed_batch, records_of


def test_a_producers_last_batch_stays_as_an_empty_batch_with_its_sequence_headers(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    partition_log.append(
        keyed_batch([(b"a", b"1"), (b"b", b"1")], timestamp=clock.time_ms(), producer=(7, 0, 0))
    )
    partition_log.append(
        keyed_batch([(b"a", b"2"), (b"b", b"2")], timestamp=clock.time_ms(), producer=(7, 0, 2))
    )
    # Another producer overwrites both keys: producer 7's batches hold nothing current.
    partition_log.append(
        keyed_batch([(b"a", b"3"), (b"b", b"3")], timestamp=clock.time_ms(), producer=(8, 0, 0))
    )
    partition_log.roll()
    clean_fully(partition_log)

    batches = list(iter_batches(read_all(partition_log)))
    by_producer = {b.producer_id: b for b in batches}
    kept = by_producer[7]
    assert kept.record_count == 0 and (kept.base_offset, kept.last_offset) == (2, 3)
    assert (kept.producer_epoch, kept.base_sequence) == (0, 2)
    assert [b.producer_id for b in batches] == [7, 8], "producer 7's first batch is gone"
    assert [(k, v) for _, k, v in records_of(partition_log)] == [(b"a", b"3"), (b"b", b"3")]

    # After a restart without producer snapshots, the replay still knows producer 7's sequence.
    partition_log.close()
    for snapshot in (tmp_path / "t-0").glob("*.snapshot"):
        snapshot.unlink()
    (tmp_path / "t-0" / ".clean-shutdown").unlink()
    reopened = compacted_log(tmp_path / "t-0", clock)
    entry = reopened.producer_state.producers[7]
    assert entry.batches[-1].last_sequence == 3 and entry.batches[-1].last_offset == 3


def test_aborted_records_go_committed_ones_count_and_markers_stay(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    ts = clock.time_ms()
    partition_log.append(keyed_batch([(b"a", b"plain")], timestamp=ts))
    partition_log.append(
        keyed_batch([(b"a", b"aborted")], timestamp=ts, producer=(5, 0, 0), transactional=True)
    )
    partition_log.append_marker(
        producer_id=5, producer_epoch=0, commit=False, coordinator_epoch=0, leader_epoch=0
    )
    partition_log.append(
        keyed_batch([(b"b", b"committed")], timestamp=ts, producer=(6, 0, 0), transactional=True)
    )
    partition_log.append_marker(
        producer_id=6, producer_epoch=0, commit=True, coordinator_epoch=0, leader_epoch=0
    )
    partition_log.append(keyed_batch([(b"c", b"x")], timestamp=ts))
    partition_log.roll()
    clean_fully(partition_log)

    values = {k: v for _, k, v in records_of(partition_log) if k is not None and not k.startswith(b"\x00")}
    # The aborted value never counts as a's latest: the plain one before it stays.
    assert values[b"a"] == b"plain" and values[b"b"] == b"committed" and values[b"c"] == b"x"
    batches = list(iter_batches(read_all(partition_log)))
    assert sum(b.is_control for b in batches) == 2, "both markers are kept"
    aborted = [b for b in batches if b.producer_id == 5 and not b.is_control]
    assert [b.record_count for b in aborted] == [0], "the aborted data is gone, its header kept (last batch)"
