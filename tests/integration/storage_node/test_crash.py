"""Kill -9 a storage node mid-append and check what survives, plus on-disk damage at restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from services.records import iter_batches

from .conftest import make_batch, start_node


def _append_until_killed(node, topic, stop: threading.Event, acknowledged: list):
    seq = 0
    while not stop.is_set():
        values = [b"rec-%d-%d" % (seq, i) for i in range(10)]
        try:
            result = node.append(topic, 0, make_batch(values))
        except grpc.RpcError:
            return  # the node died under us: this append was never acknowledged
        if result.HasField("error"):
            return
        acknowledged.append((result.base_offset, values))
        seq += 1


def _read_all(node, topic):
    records, batches, offset = [], [], 0
    end = node.describe(topic).log_end_offset
    while offset < end:
        chunk = node.fetch(topic, 0, offset, max_bytes=1 << 20)
        assert chunk.header.error() is None
        for batch in iter_batches(chunk.records):
            batch.validate(deep=True)  # no corrupt batch is ever served
            batches.append(batch)
            records.extend(batch.records())
        offset = batches[-1].next_offset
    return records, batches, end


@pytest.mark.parametrize("fsync", ["true", "false"])
def test_kill_9_mid_append_keeps_every_acknowledged_record(tmp_path, fsync):
    node = start_node(tmp_path, "crash", "--flush-before-ack", fsync)
    node.create("c")
    stop, acknowledged = threading.Event(), []
    writer = threading.Thread(target=_append_until_killed, args=(node, "c", stop, acknowledged))
    writer.start()
    time.sleep(1.5)
    node.process.kill()  # SIGKILL in the middle of the loop
    stop.set()
    writer.join(10)
    assert len(acknowledged) > 20, "the writer should have made progress before the kill"

    node.restart()
    try:
        records, batches, end = _read_all(node, "c")
        by_offset = {r.offset: r.value for r in records}
        for base_offset, values in acknowledged:
            assert [by_offset.get(base_offset + i) for i in range(len(values))] == values
        # The log ends on a batch boundary and offsets are dense.
        assert batches[-1].next_offset == end
        assert [r.offset for r in records] == list(range(end))
        # It keeps accepting appends after recovery, at the right offset.
        result = node.append("c", 0, make_batch([b"after"]))
        assert result.base_offset == end
    finally:
        node.close()
        node.process.stop()


def _segment_files(tmp_path, name, topic, suffix):
    return sorted(Path(tmp_path / f"{name}-data" / f"{topic}-0").glob(f"*{suffix}"))


def test_garbage_tail_is_truncated_after_a_crash(tmp_path):
    node = start_node(tmp_path, "garbage")
    node.create("g")
    for i in range(5):
        node.append("g", 0, make_batch([b"v%d" % i]))
    node.process.kill()
    log_file = _segment_files(tmp_path, "garbage", "g", ".log")[-1]
    clean_size = log_file.stat().st_size
    with open(log_file, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x01\x00GARBAGE" * 7)
    node.restart()
    try:
        assert log_file.stat().st_size == clean_size
        records, _, end = _read_all(node, "g")
        assert end == 5 and [r.value for r in records] == [b"v%d" % i for i in range(5)]
    finally:
        node.close()
        node.process.stop()


def test_garbage_after_a_clean_shutdown_is_not_served(tmp_path):
    node = start_node(tmp_path, "cleangarbage")
    node.create("g")
    for i in range(3):
        node.append("g", 0, make_batch([b"v%d" % i]))
    node.process.stop()  # clean shutdown: recovery scan may be skipped at the next start
    log_file = _segment_files(tmp_path, "cleangarbage", "g", ".log")[-1]
    with open(log_file, "ab") as f:
        f.write(b"\xff" * 100)
    node.restart()
    try:
        records, _, end = _read_all(node, "g")
        assert end == 3 and [r.value for r in records] == [b"v0", b"v1", b"v2"]
        assert node.append("g", 0, make_batch([b"v3"])).base_offset == 3
        records, _, end = _read_all(node, "g")
        assert [r.value for r in records][-1] == b"v3"
    finally:
        node.close()
        node.process.stop()


def test_deleted_index_is_rebuilt(tmp_path):
    node = start_node(tmp_path, "index")
    node.create("i", **{"index.interval.bytes": "100"})
    for i in range(50):
        node.append("i", 0, make_batch([b"value-%03d" % i]))
    node.process.kill()
    for index in _segment_files(tmp_path, "index", "i", ".index"):
        index.unlink()
    node.restart()
    try:
        result = node.fetch("i", 0, 37)
        first = next(iter_batches(result.records))
        assert first.base_offset == 37
        assert next(first.records()).value == b"value-037"
    finally:
        node.close()
        node.process.stop()
