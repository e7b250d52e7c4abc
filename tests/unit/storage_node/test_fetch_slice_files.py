"""The fetch port sends a slice from the file the slice was taken from, whatever the log does to
its path meanwhile: the cleaner renames a cleaned segment to the name of the segment it replaces
and unlinks the old one, retention unlinks segments. A fetch answered between the read and the
send must carry the bytes it announced, never nothing and never another file's bytes."""

from __future__ import annotations

import asyncio
import os

from services.fetchport import protocol
from storage_node.fetch.server import FetchServer, slice_descriptor
from storage_node.log.file_records import FileRecords, FileSlice


class RecordingLink:
    """A link that keeps what is sent (headers and file bytes, in order)."""

    zero_copy = True

    def __init__(self) -> None:
        self.sent = bytearray()

    async def send_header(self, header: bytes, *, more: bool) -> None:
        self.sent += header

    async def send_file(self, file_fd: int, position: int, length: int) -> None:
        data = os.pread(file_fd, length, position)
        if len(data) != length:
            raise OSError(f"file ended early: {len(data)} of {length}")
        self.sent += data


class _Info:
    def __init__(self, file_slice: FileSlice) -> None:
        self.slice = file_slice
        self.high_watermark = 10
        self.log_start_offset = 0
        self.log_end_offset = 10


def _slice_then_swap(tmp_path) -> tuple[FileRecords, FileSlice, bytes]:
    """A slice of ``0.log``, then the cleaner's moves: the old file renamed and unlinked, a
    different (shorter) file renamed in under the same name."""
    original = b"old-segment-bytes " * 100
    records = FileRecords.open(tmp_path / "0.log")
    records.append(original)
    file_slice = records.slice(0, len(original))
    records.rename_to(tmp_path / "0.log.deleted")
    records.delete_file()
    (tmp_path / "0.log.swap").write_bytes(b"cleaned")
    os.replace(tmp_path / "0.log.swap", tmp_path / "0.log")
    return records, file_slice, original


def test_the_descriptor_reads_the_sliced_file_after_it_was_replaced_and_unlinked(tmp_path):
    _, file_slice, original = _slice_then_swap(tmp_path)
    fd = slice_descriptor(file_slice)
    try:
        assert os.pread(fd, file_slice.length, file_slice.position) == original
    finally:
        os.close(fd)
    # Ours to close: the slice's own descriptor is still open after we closed the duplicate.
    assert os.pread(file_slice.fileno(), 3, 0) == original[:3]


def test_an_answer_sent_after_the_swap_carries_the_announced_bytes_of_the_old_file(tmp_path):
    _, file_slice, original = _slice_then_swap(tmp_path)
    server = FetchServer(reader=None, notifier=None)
    link = RecordingLink()
    sent = asyncio.run(server._send_slice(link, 7, _Info(file_slice)))
    assert sent == len(original)
    header = protocol.encode_response_header(
        7, high_watermark=10, log_start_offset=0, log_end_offset=10, records_length=len(original)
    )
    assert bytes(link.sent) == header + original
    assert server.stats.sendfile_bytes == len(original)
