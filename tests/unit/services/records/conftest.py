"""Fixtures for the RecordBatch v2 tests (oracles live in ``records_oracles.py``, the codec
backends in ``records_backends.py``)."""

from __future__ import annotations

import pytest

from .records_backends import BACKENDS, use_backend
from .records_oracles import golden_batch, golden_record


@pytest.fixture(params=BACKENDS)
def codec_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with the pure-Python codec loops and once with the C accelerator.

    Test modules that exercise encoding or decoding opt in with
    ``pytestmark = pytest.mark.usefixtures("codec_backend")``.
    """
    use_backend(monkeypatch, request.param)
    return request.param


@pytest.fixture
def three_record_batch() -> bytes:
    """A small uncompressed batch: a keyed record with headers, a tombstone, an empty value."""
    payload = (
        golden_record(0, 0, b"k0", b"v0", (("h", b"x"), ("n", None)))
        + golden_record(1, 5, None, None)
        + golden_record(2, -3, b"", b"")
    )
    return golden_batch(
        payload,
        base_offset=100,
        last_offset_delta=2,
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_005,
        record_count=3,
    )
