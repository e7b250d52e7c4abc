"""Key/value (de)serializers and header normalisation.

As in kafka-python, a serializer is any ``callable(obj) -> bytes`` and a deserializer any
``callable(bytes) -> obj``; ``None`` keys and values (null key, tombstone) bypass them. Without a
serializer, bytes-like objects pass through and ``str`` is encoded as UTF-8 (a convenience
kafka-python does not offer); anything else is a ``TypeError`` naming the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]

_BYTES_TYPES = (bytes, bytearray, memoryview)


def to_bytes(obj: Any, what: str) -> bytes | bytearray | memoryview:
    """The default serializer: bytes-like as is, ``str`` as UTF-8."""
    if isinstance(obj, _BYTES_TYPES):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    raise TypeError(
        f"{what} must be bytes or str, not {type(obj).__name__}; pass {what}_serializer= to send other types"
    )


def serialize(obj: Any, serializer: Serializer | None, what: str):
    """``obj`` as bytes (``None`` stays ``None``)."""
    if obj is None:
        return None
    if serializer is None:
        return to_bytes(obj, what)
    data = serializer(obj)
    return None if data is None else to_bytes(data, what)


def normalize_headers(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> tuple:
    """Headers as a tuple of ``(str, bytes | None)``; accepts pairs or a mapping, str values."""
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    normalized = []
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"header key must be str, not {type(key).__name__}")
        normalized.append((key, None if value is None else to_bytes(value, "header value")))
    return tuple(normalized)


def headers_size(headers: tuple) -> int:
    """Approximate encoded size of ``headers`` (for buffer accounting and size checks)."""
    return sum(len(key) + (len(value) if value is not None else 0) + 2 for key, value in headers)


# ---- ready-made (de)serializers ----------------------------------------------------------------


def string_serializer(obj: str) -> bytes:
    return obj.encode("utf-8")


def string_deserializer(data: bytes) -> str:
    return data.decode("utf-8")


def json_serializer(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def json_deserializer(data: bytes) -> Any:
    return json.loads(data)
