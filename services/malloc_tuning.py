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
"""

from __future__ import annotations

import ctypes
import ctypes.util
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


def keep_large_buffers_in_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where that is not possible
    (not glibc, or the operator tuned malloc through ``GLIBC_TUNABLES``)."""
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    log.debug("malloc thresholds raised: %s", ok)
    return ok
