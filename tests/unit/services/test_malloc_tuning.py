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
