"""Typed fetch answers are decoded and encoded off the event loop, and their memory given back.

The problem: a typed Fetch turns record batches into Python objects and then protobuf. Done on
the event loop, one answer over a 2.3 MB zstd batch holding 3 million records stalled every
client of the gateway for ~4.6 s and left the process at ~900 MiB.

Three parts answer it:

* bounds per answer (:class:`gateway.server.fetch_assembly.DecodeBudget`: records and decompressed
  bytes; the rest comes in the next fetch) cap what one answer builds;
* this pool runs what remains -- decompressing, decoding within the bounds, building the protobuf
  answer -- on a few threads, so the loop keeps answering everyone else. The threads hold the GIL
  only in short steps (the C decoder for one window of records, one protobuf message at a time;
  zstd, gzip and lz4 release it while they decompress), and the interpreter hands the GIL to the
  loop's thread every switch interval (5 ms) between those steps. Few threads also bound how many
  answers are being built at once, and so the memory they take together;
* once an answer that built a lot has been sent, :func:`services.malloc_tuning.release_free_memory`
  runs on the pool: the gateway raises glibc's trim threshold (see ``services/malloc_tuning.py``)
  and worker threads allocate from arenas of their own, so without it a rare large answer would
  keep its peak resident.

The pool also builds the record batches of large typed produce requests
(:data:`gateway.server.produce.OFFLOAD_BUILD_BYTES`), for the same reason.

Thread-safety: ``run`` and ``account`` are called from the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from services.malloc_tuning import release_free_memory

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Python objects and protobuf per decoded record, beyond its key and value bytes (measured with
#: tracemalloc on small records: the Record tuple, two ints, two bytes objects, the message).
RECORD_OVERHEAD_BYTES = 300
#: Decoding work (estimated bytes built) after which the free memory is handed back.
RELEASE_AFTER_BYTES = 16 << 20


class DecodePool:
    """A small thread pool for typed fetch answers, and the release of their memory."""

    def __init__(self, *, threads: int, release_after_bytes: int = RELEASE_AFTER_BYTES) -> None:
        if threads < 1:
            raise ValueError("the decode pool needs at least one thread")
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fetch-decode")
        self._release_after_bytes = release_after_bytes
        self._built_since_release = 0

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)`` on a pool thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def account(self, records: int, payload_bytes: int) -> None:
        """Note what an answer decoded (call once per answer, from the loop)."""
        self._built_since_release += payload_bytes + records * RECORD_OVERHEAD_BYTES

    def answer_sent(self, *_ignored: Any) -> None:
        """After a typed answer is sent: hand free memory back if enough was built since the last
        time. Usable as a gRPC ``add_done_callback``."""
        if self._built_since_release < self._release_after_bytes:
            return
        self._built_since_release = 0
        try:
            self._executor.submit(release_free_memory)
        except RuntimeError:  # shut down meanwhile: the process is going away anyway
            log.debug("decode pool closed; memory not released")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
