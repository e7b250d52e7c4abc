"""The log cleaner in a real storage node process: compacted topics shrink on disk, readers never
see a corrupt batch while it runs, and kill -9 in the middle of cleaning loses nothing."""

from __future__ import annotations

import contextlib
import threading
import time

from services.records import RecordBatchBuilder, iter_batches

from .conftest import start_node

_FAST_CLEANER = ("--log-cleaner-backoff-ms", "50", "--maintenance-interval-ms", "100")
_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.1"}


def _batch(pairs, timestamp=None) -> bytes:
    builder = RecordBatchBuilder()
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    for key, value in pairs:
        builder.append(value, timestamp=ts, key=key)
    return builder.build()


def _produce(node, topic, rounds, keys, offset_of) -> int:
    """Append ``rounds`` batches of 5 records over ``keys`` keys; returns the bytes appended."""
    appended = 0
    for i in range(rounds):
        pairs = [(b"key-%d" % ((i * 5 + j) % keys), b"value-%d-%d" % (i, j)) for j in range(5)]
        data = _batch(pairs)
        result = node.append(topic, 0, data)
        assert not result.HasField("error"), result
        appended += len(data)
        for j, (key, value) in enumerate(pairs):
            offset_of[key] = (result.base_offset + j, value)
    return appended


def _read_all(node, topic):
    """(offset, key, value) of every record from offset 0, every batch validated deeply."""
    records, offset = [], 0
    end = node.describe(topic).log_end_offset
    while offset < end:
        chunk = node.fetch(topic, 0, offset, max_bytes=1 << 16)
        assert chunk.header.error() is None
        batches = list(iter_batches(chunk.records))
        assert batches, f"no batch at offset {offset} below the log end {end}"
        for batch in batches:
            batch.validate(deep=True)  # never a corrupt batch
            records.extend((r.offset, r.key, r.value) for r in batch.records() if r.offset >= offset)
        offset = batches[-1].next_offset
    return records


def _segment_bytes(data_dir, topic) -> int:
    total = 0
    for path in (data_dir / f"{topic}-0").glob("*.log"):
        # the cleaner may delete a segment it replaced between the listing and the stat
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_compacted_topic_shrinks_and_keeps_the_latest_value_per_key(tmp_path):
    node = start_node(tmp_path, "compact", *_FAST_CLEANER)
    try:
        node.create("c", **_TOPIC_CONFIGS)
        latest: dict[bytes, tuple[int, bytes]] = {}
        produced_bytes = _produce(node, "c", 400, 20, latest)
        data_dir = tmp_path / "compact-data"
        # Everything but the active segment (at most segment.bytes) is cleaned down to 20 keys.
        _wait_for(
            lambda: _segment_bytes(data_dir, "c") < produced_bytes / 4, 20, "the cleaner to shrink the log"
        )
        records = _read_all(node, "c")
        offsets = [o for o, _, _ in records]
        assert offsets == sorted(set(offsets))
        newest = {key: (offset, value) for offset, key, value in records}
        assert newest == latest
        # Superseded values may remain only in the active segment, never beyond the cleaned part.
        assert len(records) < 400 * 5 / 4
    finally:
        node.close()
        node.process.stop()


def test_readers_never_see_a_corrupt_batch_while_the_cleaner_runs(tmp_path):
    node = start_node(tmp_path, "readers", *_FAST_CLEANER)
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]

    def reader():
        while not stop.is_set():
            try:
                records = _read_all(node, "r")
                offsets = [o for o, _, _ in records]
                assert offsets == sorted(set(offsets)), "offsets must only increase"
                reads[0] += 1
            except BaseException as exc:  # noqa: BLE001 -- reported by the test thread
                failures.append(exc)
                return

    try:
        node.create("r", **_TOPIC_CONFIGS)
        latest: dict[bytes, tuple[int, bytes]] = {}
        _produce(node, "r", 50, 10, latest)
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        data_dir = tmp_path / "readers-data"
        for _ in range(8):
            _produce(node, "r", 50, 10, latest)
        _wait_for(lambda: (data_dir / "r-0" / "cleaner-offset-checkpoint").exists(), 20, "a cleaning round")
        _produce(node, "r", 50, 10, latest)
        _wait_for(lambda: reads[0] >= 5 or failures, 20, "concurrent reads")
        stop.set()
        thread.join(20)
        assert not failures, failures[0]
        assert {key: (o, v) for o, key, v in _read_all(node, "r")} == latest
    finally:
        stop.set()
        node.close()
        node.process.stop()


def test_kill_9_while_cleaning_loses_nothing(tmp_path):
    """A throttled cleaner is slow enough that the kill lands mid-round; at restart the loader
    finishes or discards what it left and the log still holds each key's latest value."""
    throttled = ("--log-cleaner-io-max-bytes-per-second", "200000")
    node = start_node(tmp_path, "kill", *_FAST_CLEANER, *throttled)
    try:
        node.create("k", **_TOPIC_CONFIGS)
        latest: dict[bytes, tuple[int, bytes]] = {}
        _produce(node, "k", 600, 30, latest)
        data_dir = tmp_path / "kill-data" / "k-0"
        # A round can start and finish between two looks (on a busy machine the cleaner keeps up
        # with the appends): keep giving it dirty segments until a look finds one in progress.
        deadline = time.monotonic() + 30
        while not any(p.name.endswith((".cleaned", ".swap")) for p in data_dir.iterdir()):
            assert time.monotonic() < deadline, "the cleaner never started writing a cleaned segment"
            _produce(node, "k", 5, 30, latest)
        node.process.kill()
        node.restart()
        records = _read_all(node, "k")
        offsets = [o for o, _, _ in records]
        assert offsets == sorted(set(offsets))
        assert {key: (o, v) for o, key, v in records} == latest
    finally:
        node.close()
        node.process.stop()
