"""Fault-injection points of the Spark jobs, declared in one place.

Like Redpanda's ``failure_probes``: production code calls :func:`maybe_crash_after` at named
points, and nothing happens unless a test names that point in the environment. The process then
ends with ``os._exit`` -- no ``finally`` blocks, no flushing, no atexit hooks -- which is as close
to ``kill -9`` at that instant as Python gets.

``TRIBUTARY_LOADER_CRASH_AFTER=<point>`` (the offline loader, :mod:`spark_jobs.loader`):

=============  ==========================================================================
``write``      the batch's Parquet files are written (staged), no manifest yet: a re-run
               discards them and loads the same offsets again
``manifest``   the offsets manifest is written (the commit point), files not yet published:
               a re-run finishes publishing them
``publish``    files published, the group's offsets not yet committed: a re-run commits them
=============  ==========================================================================
"""

from __future__ import annotations

import os
import sys

LOADER_CRASH_ENV = "TRIBUTARY_LOADER_CRASH_AFTER"
LOADER_POINTS = ("write", "manifest", "publish")
#: Exit status of an injected crash, so a test can tell it from a real failure.
CRASH_EXIT_CODE = 86


def maybe_crash_after(point: str, *, env_var: str = LOADER_CRASH_ENV, environ=None) -> None:
    """End the process at once if ``$env_var`` names ``point``."""
    environ = os.environ if environ is None else environ
    if point not in LOADER_POINTS:
        raise ValueError(f"unknown fault-injection point {point!r}; declared: {', '.join(LOADER_POINTS)}")
    if environ.get(env_var) == point:
        print(f"fault injection: {env_var}={point}: exiting now", file=sys.stderr, flush=True)
        os._exit(CRASH_EXIT_CODE)
