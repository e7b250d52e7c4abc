"""Property tests of compaction over random key / value / tombstone sequences and segment sizes.

After cleaning: every key's last record is there at its offset, offsets only increase, every
retained record is byte-identical to what was produced (its encoded bytes inside the batch), and
tombstones are gone once ``delete.retention.ms`` has passed -- whatever the segment size, the
codec, or how small the offset map is (several rounds).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.clock import ManualClock
from services.records import Compression, RecordBatchView, iter_batches
from storage_node.log.cleaner.batch_filter import record_spans
from tests.unit.storage_node.log_testkit import read_all

from .compaction_kit import clean, clean_fully, compacted_log, keyed_batch

_KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j", b"k", b"l"])
_VALUES = st.one_of(st.none(), st.binary(min_size=0, max_size=40))
_RECORD = st.tuples(st.one_of(_KEYS, _KEYS, _KEYS, st.none()), _VALUES)
_BATCH = st.lists(_RECORD, min_size=1, max_size=6)
_RETENTION_MS = 60_000


def _raw_records(data: bytes) -> dict[int, bytes]:
    """offset -> the record's encoded bytes, for every record in ``data``."""
    out = {}
    for batch in iter_batches(data):
        batch.validate(deep=True)
        payload = batch.payload()
        for span in record_spans(RecordBatchView(batch.buffer), payload):
            out[span.offset] = bytes(payload[span.start : span.end])
    return out


def _decoded(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for batch in iter_batches(data) for r in batch.records()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(_BATCH, min_size=1, max_size=40),
    segment_bytes=st.integers(min_value=600, max_value=4000),  # a batch (at most ~450 bytes) fits
    map_keys=st.integers(min_value=1, max_value=20),
    compression=st.sampled_from([Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]),
)
def test_compaction_keeps_each_keys_last_record_byte_for_byte(batches, segment_bytes, map_keys, compression):
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(start_ms=1_700_000_000_000)
        partition_log = compacted_log(
            Path(tmp) / "t-0", clock, segment_bytes=segment_bytes, delete_retention_ms=_RETENTION_MS
        )
        for records in batches:
            partition_log.append(keyed_batch(records, timestamp=clock.time_ms(), compression=compression))
            clock.advance(10)
        end = partition_log.log_end_offset
        partition_log.roll()
        produced_data = read_all(partition_log)
        produced = _decoded(produced_data)
        produced_raw = _raw_records(produced_data)

        # Enough map for at least one key per round; tiny maps take many rounds.
        clean_fully(partition_log, map_memory_bytes=24 * map_keys * 2)

        data = read_all(partition_log)
        after = _decoded(data)
        offsets = [offset for offset, _, _ in after]
        assert offsets == sorted(set(offsets)), "offsets only increase"
        assert partition_log.log_end_offset == end
        raw = _raw_records(data)
        assert all(raw[offset] == produced_raw[offset] for offset in offsets), "records byte-identical"
        last = {key: offset for offset, key, _ in produced if key is not None}
        kept_keyed = {offset for offset, key, _ in after if key is not None}
        assert kept_keyed == set(last.values()), "exactly each key's last record (tombstones too, for now)"
        unkeyed = [offset for offset, key, _ in produced if key is None]
        assert [o for o, k, _ in after if k is None] == unkeyed, "records without a key are never removed"

        # Past delete.retention.ms, the next round (there is new dirty data) drops the tombstones.
        clock.advance(_RETENTION_MS + 1)
        partition_log.append(
            keyed_batch([(b"zz", b"new")], timestamp=clock.time_ms(), compression=compression)
        )
        partition_log.roll()
        clean_fully(partition_log, map_memory_bytes=24 * map_keys * 2)
        final = _decoded(read_all(partition_log))
        assert not [1 for _, key, value in final if key is not None and value is None], "tombstones removed"
        live = {
            key: offset
            for key, offset in last.items()
            if dict(((o, v) for o, _, v in produced))[offset] is not None
        }
        assert {offset for offset, key, _ in final if key not in (None, b"zz")} == set(live.values())
        partition_log.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(_BATCH, min_size=2, max_size=30), rounds=st.integers(min_value=1, max_value=4))
def test_cleaning_interleaved_with_appends_matches_cleaning_once(batches, rounds):
    """However appends and rounds interleave, the result is each key's last record."""
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(start_ms=1_700_000_000_000)
        partition_log = compacted_log(Path(tmp) / "t-0", clock, segment_bytes=400)
        produced: list[tuple[int, bytes | None]] = []
        step = max(1, len(batches) // rounds)
        for i, records in enumerate(batches):
            info = partition_log.append(keyed_batch(records, timestamp=clock.time_ms()))
            produced += [(info.first_offset + j, key) for j, (key, _) in enumerate(records)]
            if i % step == step - 1:
                partition_log.roll()
                clean(partition_log)
        partition_log.roll()
        clean_fully(partition_log)
        last = {key: offset for offset, key in produced if key is not None}
        after = _decoded(read_all(partition_log))
        assert {offset for offset, key, _ in after if key is not None} == set(last.values())
        partition_log.close()
