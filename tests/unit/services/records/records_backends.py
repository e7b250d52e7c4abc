"""The two backends of the record codec's per-record loops, for tests that run against both.

``services.records.record`` binds ``decode_records``, ``validate_records`` and
``scan_producer_batches``, and ``services.records.builder`` binds ``_append_record``, to the C
accelerator or to the pure-Python code at import. :func:`use_backend` rebinds all four, so one
test body can run against either.
"""

from __future__ import annotations

import pytest

from services.records import builder as builder_module
from services.records import record as record_module

#: The compiled C accelerator, loaded whatever ``TRIBUTARY_NO_EXTENSIONS`` says so that both
#: backends are tested in every run; ``None`` if it was not built (then the "c" tests fail).
SPEEDUPS = record_module.load_speedups()
BACKENDS = ("python", "c")


def require_speedups():
    """The C module, or a failed assertion saying it is missing (never a skip)."""
    assert SPEEDUPS is not None, "services.records._speedups is not built (see setup.py)"
    return SPEEDUPS


def use_backend(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Point every dispatch point of the record codec at ``"python"`` or ``"c"``."""
    if backend == "c":
        speedups = require_speedups()
        decode, validate, append = speedups.decode_records, speedups.validate_records, speedups.append_record
        scan = speedups.scan_producer_batches
    else:
        assert backend == "python", backend
        decode, validate, append = record_module.py_decode_records, record_module.py_validate_records, None
        scan = record_module.py_scan_producer_batches
    monkeypatch.setattr(record_module, "decode_records", decode)
    monkeypatch.setattr(record_module, "validate_records", validate)
    monkeypatch.setattr(record_module, "scan_producer_batches", scan)
    monkeypatch.setattr(builder_module, "_append_record", append)
