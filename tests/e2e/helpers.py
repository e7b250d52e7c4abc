"""Helpers of the end-to-end tests (not fixtures)."""

from __future__ import annotations

import time


def read_topic(spark, servers: str, **options):
    """``spark.read.format("tributary")`` with ``servers`` and the given options."""
    reader = spark.read.format("tributary").option("servers", servers)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def worker_log_lines(spark, fragment: str, *, wait_s: float = 10.0) -> list[str]:
    """Messages executors logged that contain ``fragment`` (worker logs arrive asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = spark.tvf.python_worker_logs().select("msg").collect()
        found = [r.msg for r in rows if r.msg and fragment in r.msg]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
