"""A client's slice of etcd's flat key space: the per-cluster prefix and key ranges.

Every key a caller names is relative to the prefix (e.g. ``/tributary/<cluster>/``); this module
turns it into etcd's bytes and back, and builds the ``[key, range_end)`` pair etcd uses for
"every key starting with". Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from .values import KeyValue

#: etcd's "no upper bound" range end: every key >= the start key.
_ALL_KEYS_END = b"\x00"


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range end covering every key that starts with ``prefix``.

    The prefix with its last byte below 0xff incremented (trailing 0xff bytes dropped); if every
    byte is 0xff, or the prefix is empty, ``b"\\0"`` meaning "to the end of the key space".
    """
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return _ALL_KEYS_END


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Maps caller keys (``str``, relative) to etcd keys (``bytes``, absolute) and back."""

    prefix: str = ""

    def encode(self, key: str) -> bytes:
        """The absolute etcd key for ``key``."""
        if not isinstance(key, str):
            raise TypeError(f"etcd keys are str, got {type(key).__name__}")
        full = (self.prefix + key).encode("utf-8", "surrogateescape")
        if not full:
            raise ValueError("the empty key is not a valid etcd key")
        return full

    def decode(self, raw: bytes) -> str:
        """The caller key for an absolute etcd key inside this key space."""
        # surrogateescape: a key that is not UTF-8 (written by another tool) must not break a
        # watch or a listing; it decodes losslessly and encodes back to the same bytes.
        text = raw.decode("utf-8", "surrogateescape")
        if not text.startswith(self.prefix):
            raise ValueError(f"etcd key {text!r} is outside the key space {self.prefix!r}")
        return text[len(self.prefix) :]

    def prefix_range(self, prefix: str) -> tuple[bytes, bytes]:
        """``(key, range_end)`` covering every key starting with ``prefix`` (``""``: all of ours)."""
        start = (self.prefix + prefix).encode("utf-8", "surrogateescape")
        if not start:
            return _ALL_KEYS_END, _ALL_KEYS_END  # etcd: both "\0" means the whole key space
        return start, prefix_range_end(start)

    def key_value(self, pb) -> KeyValue:
        """A :class:`KeyValue` from an ``mvccpb.KeyValue`` message."""
        return KeyValue(
            key=self.decode(pb.key),
            value=pb.value,
            create_revision=pb.create_revision,
            mod_revision=pb.mod_revision,
            version=pb.version,
            lease=pb.lease,
        )


def to_bytes(value: bytes | str) -> bytes:
    """Values may be given as ``str`` (stored as UTF-8) or ``bytes``."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"etcd values are bytes or str, got {type(value).__name__}")
