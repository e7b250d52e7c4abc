"""The malloc thresholds the storage node and gateway raise at start (services/malloc_tuning.py).

Each case runs in a fresh interpreter: the setting is process-wide and ``GLIBC_TUNABLES`` is read
when a process starts.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROBE = "from services.malloc_tuning import keep_large_buffers_in_heap as k; print(k())"


def _run_probe(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env_extra
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_raises_the_thresholds_on_glibc():
    expected = "True" if platform.libc_ver()[0] == "glibc" else "False"
    assert _run_probe({}) == expected


def test_leaves_operator_tunables_alone():
    assert _run_probe({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) == "False"


def test_trimmer_gives_back_a_burst_once_and_leaves_steady_traffic_alone():
    from services.malloc_tuning import HeapTrimmer

    free = [0]
    trims = []
    trimmer = HeapTrimmer(lambda: free[0], lambda: trims.append(free[0]), retained_bytes=64)
    for steady in (10, 40, 63, 20):  # buffers reused under the bound: never trimmed
        free[0] = steady
        assert not trimmer.should_trim()
    free[0] = 125  # a burst ended: its memory is free
    assert trimmer.should_trim()
    trimmer.trim()
    assert trims == [125]
    assert not trimmer.should_trim()  # the same free chunks, their pages already returned
    free[0] = 126  # traffic again: some pages may be back
    assert trimmer.should_trim()


TRIM_PROBE = """
from services.malloc_tuning import HeapTrimmer, keep_large_buffers_in_heap, resident_bytes
keep_large_buffers_in_heap()
trimmer = HeapTrimmer.for_this_process()
blocks = [bytearray(4 << 20) for _ in range(48)]  # below the mmap threshold: on the heap
small = [bytearray(64) for _ in range(1000)]  # live data above them: the heap top cannot shrink
held = resident_bytes()
del blocks
kept = resident_bytes()
assert trimmer.should_trim()
trimmer.trim()
again = trimmer.should_trim()  # before anything else allocates (reading /proc does)
print(held >> 20, kept >> 20, resident_bytes() >> 20, again)
"""


def test_trimmer_returns_freed_heap_pages_on_glibc():
    if platform.libc_ver()[0] != "glibc":  # elsewhere there is nothing to trim
        assert _run_probe({}) == "False"
        return
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    done = subprocess.run(
        [sys.executable, "-c", TRIM_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    held, kept, trimmed, again = done.stdout.split()
    assert int(kept) > int(held) - 32  # freed, but glibc kept the pages (the tuning's cost)
    assert int(trimmed) < int(kept) - 150  # given back
    assert again == "False"
