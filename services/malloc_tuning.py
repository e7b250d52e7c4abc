"""Keep large request buffers in the malloc heap instead of fresh mmap'd memory (glibc only).

Services that receive megabyte-sized gRPC messages allocate a few large ``bytes`` per request
(the protobuf field, the copy the log stamps offsets into). glibc serves allocations above its
mmap threshold with a fresh ``mmap`` and returns them with ``munmap``, so every request pays a page
fault per 4 KiB touched plus zeroing and unmapping: measured with ``perf`` on a storage node taking
1 MiB appends, page faults, page clearing and unmapping were ~20% of its CPU, and raising the
threshold took ``bench/storage.py``'s single-partition append rate from ~200 to ~350 MB/s.

A fixed threshold also turns off glibc's dynamic threshold, and the raised trim threshold keeps
freed heap memory for reuse instead of giving it back after every request. The cost is resident
memory that stays at the high-water mark of in-flight requests, which the gRPC message size limit
already bounds. ``GLIBC_TUNABLES`` set by an operator wins: we leave it alone.

A process that now and then builds far more than a request's bytes -- the gateway decoding a
typed fetch answer: Python objects and protobuf for tens of thousands of records, in worker
threads whose malloc arenas the trim threshold never shrinks -- calls :func:`release_free_memory`
after it, so that a rare large answer does not leave its peak resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

# From glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Allocations up to this size come from the heap (glibc caps the setting at 32 MiB on 64-bit).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free heap memory kept before glibc trims it back to the system.
TRIM_THRESHOLD_BYTES = 128 << 20


@functools.cache
def _libc():
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
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
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
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # no libc found; musl, macOS: no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    log.debug("malloc thresholds raised: %s", ok)
    return ok
