"""Keep large request buffers in the malloc heap instead of fresh mmap'd memory (glibc only).

Services that receive megabyte-sized gRPC messages allocate a few large ``bytes`` per request
(the protobuf field, the copy the log stamps offsets into). glibc serves allocations above its
mmap threshold with a fresh ``mmap`` and returns them with ``munmap``, so every request pays a page
fault per 4 KiB touched plus zeroing and unmapping: measured with ``perf`` on a storage node taking
1 MiB appends, page faults, page clearing and unmapping were ~20% of its CPU, and raising the
threshold took ``bench/storage.py``'s single-partition append rate from ~200 to ~350 MB/s.

A fixed threshold also turns off glibc's dynamic threshold, and the raised trim threshold keeps
freed heap memory for reuse instead of giving it back after every request. ``GLIBC_TUNABLES`` set
by an operator wins: we leave it alone.

The cost is resident memory that stays at the high-water mark of in-flight requests: measured,
one 100 MB Produce left a gateway at 177 MiB and its storage node at 243 MiB resident, up from
~52 MiB, for good (glibc's trim threshold only looks at the top of the main heap, and the
request's chunks sit in several arenas). :class:`HeapTrimmer` bounds what stays: once a second it
asks glibc how much heap is free (``mallinfo2``), and when that exceeds
:data:`RETAINED_FREE_BYTES` it calls ``malloc_trim(0)``, which returns every free page of every
arena -- but one part: a thread arena's *top* (the free space at the end of its 64 MiB heap,
where a freed large request coalesces) is not touched by ``malloc_trim``; glibc shrinks it only
from ``free()``, and only once it exceeds the trim threshold. With a 128 MiB threshold a thread
arena's top could never reach it, so a gateway that took a 100 MB request in gRPC's threads kept
~100 MiB in two arena tops for good while holding 16 MB in use (found with ``malloc_stats()``
through gdb, 2026-11-24). The trim threshold is therefore 16 MiB, below the arena heap size:
measured with ``bench/storage.py`` (1 MiB appends, alternating runs), CPU per GB appended was the
same as with 128 MiB. A burst is given back within about a second after it ends. Steady
traffic keeps the gain: its buffers are reused between trims, so at worst a trim a second makes
it fault its working set in once a second, where per-request mmap faulted every request's bytes
in.

A process that now and then builds far more than a request's bytes -- the gateway decoding a
typed fetch answer: Python objects and protobuf for tens of thousands of records, in worker
threads -- also calls :func:`release_free_memory` right after it, so that a rare large answer
does not stay resident until the trimmer's next look.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

# From glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Allocations up to this size come from the heap (glibc caps the setting at 32 MiB on 64-bit).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free memory at the top of a heap (main or thread arena) kept before glibc trims it back to
#: the system on ``free()``: below a thread arena's 64 MiB heap, or its top is never given back.
TRIM_THRESHOLD_BYTES = 16 << 20
#: Free heap memory :class:`HeapTrimmer` leaves for reuse; beyond it, it is given back.
RETAINED_FREE_BYTES = 64 << 20
#: How often :class:`HeapTrimmer` looks.
TRIM_CHECK_INTERVAL_S = 1.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def release_free_memory() -> bool:
    """Give the free memory of every malloc arena back to the system (glibc's ``malloc_trim(0)``);
    False where there is no such call. Takes milliseconds for hundreds of MiB: call it off the
    event loop, after large work, not per request."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:  # not glibc
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    trim(0)
    return True


def keep_large_buffers_in_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where that is not possible
    (not glibc, or the operator tuned malloc through ``GLIBC_TUNABLES``)."""
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    try:
        mallopt = libc.mallopt if libc is not None else None
    except AttributeError:  # musl, macOS: no mallopt
        return False
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    log.debug("malloc thresholds raised: %s", ok)
    return ok


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


class HeapTrimmer:
    """Gives free heap memory back to the system after a burst (see the module docstring).

    The decision (:meth:`should_trim`) reads glibc's count of free heap bytes. That count does not
    drop when ``malloc_trim`` returns pages (the chunks stay free, only their pages go), so a
    trim is repeated only once the count has changed -- some allocation or free happened, which
    may have brought pages back -- not every second of an idle process. :meth:`routine` runs the
    check every :data:`TRIM_CHECK_INTERVAL_S` on the event loop and the trim, which walks every
    arena, in a worker thread.
    """

    def __init__(
        self,
        free_heap_bytes: Callable[[], int],
        trim: Callable[[], object],
        *,
        retained_bytes: int = RETAINED_FREE_BYTES,
    ) -> None:
        self._free_heap_bytes = free_heap_bytes
        self._trim = trim
        self.retained_bytes = retained_bytes
        self._free_at_last_trim: int | None = None
        self.trims = 0

    @classmethod
    def for_this_process(cls, **kwargs) -> HeapTrimmer | None:
        """A trimmer on glibc's ``mallinfo2`` and ``malloc_trim``; None where they are missing."""
        libc = _libc()
        try:
            mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim  # type: ignore[union-attr]
        except AttributeError:  # not glibc 2.33+ (or no libc found)
            return None
        mallinfo2.argtypes, mallinfo2.restype = (), _MallInfo2
        malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
        return cls(lambda: mallinfo2().fordblks, lambda: malloc_trim(0), **kwargs)

    def should_trim(self) -> bool:
        """More than ``retained_bytes`` of heap free, and the heap changed since the last trim."""
        free = self._free_heap_bytes()
        return free > self.retained_bytes and free != self._free_at_last_trim

    def trim(self) -> None:
        self._trim()
        self.trims += 1
        self._free_at_last_trim = self._free_heap_bytes()

    async def routine(self, interval_s: float = TRIM_CHECK_INTERVAL_S) -> None:
        """Check every ``interval_s`` and trim when :meth:`should_trim`; runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self.should_trim():
                before = resident_bytes()
                await asyncio.to_thread(self.trim)
                log.debug("gave free heap memory back: resident %d -> %d bytes", before, resident_bytes())


def start_heap_trimmer() -> asyncio.Task | None:
    """Start :meth:`HeapTrimmer.routine` on the running loop (None where malloc is not glibc's)."""
    trimmer = HeapTrimmer.for_this_process()
    if trimmer is None:
        return None
    return asyncio.get_running_loop().create_task(trimmer.routine(), name="heap-trimmer")
