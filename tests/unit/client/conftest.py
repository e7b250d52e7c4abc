"""Fixtures shared by the SDK's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.client.io_thread import IOThread


@pytest.fixture
def idle_io() -> Iterator[IOThread]:
    """A started I/O thread whose loop allows calls on the caller's thread while it idles."""
    thread = IOThread("test-idle-io", idle_calls=True)
    yield thread
    thread.stop()
