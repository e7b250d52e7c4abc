"""Transaction building blocks: compares, operations and results, as plain values.

A transaction is ``if all(compares) then success ops else failure ops``, applied atomically at one
revision. :class:`Compare` and :class:`Op` are built by callers with keys relative to the client
prefix; the client turns them into protobuf with its :class:`~services.etcd.keyspace.KeySpace`.

etcd's rules worth knowing: a compare on a key that does not exist sees ``create_revision``,
``mod_revision``, ``version`` and ``lease`` as 0, but every ``value`` compare on it is false; one
txn may not write the same key twice; etcd caps a txn at 128 operations by default
(``--max-txn-ops``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import _rpc
from .keyspace import KeySpace, to_bytes
from .values import KeyValue

CompareOp = Literal["==", "!=", ">", "<"]

_RESULTS = {
    "==": _rpc.Compare.EQUAL,
    "!=": _rpc.Compare.NOT_EQUAL,
    ">": _rpc.Compare.GREATER,
    "<": _rpc.Compare.LESS,
}
# target name -> (protobuf CompareTarget, the name of the oneof field carrying the operand)
_TARGETS = {
    "version": (_rpc.Compare.VERSION, "version"),
    "create": (_rpc.Compare.CREATE, "create_revision"),
    "mod": (_rpc.Compare.MOD, "mod_revision"),
    "value": (_rpc.Compare.VALUE, "value"),
    "lease": (_rpc.Compare.LEASE, "lease"),
}


def lease_id(lease: Any) -> int:
    """A lease id from a :class:`~services.etcd.lease.Lease`, an int, or None (0: no lease)."""
    if lease is None:
        return 0
    if isinstance(lease, int):
        return lease
    return int(lease.id)


@dataclass(frozen=True, slots=True)
class Compare:
    """One predicate on one key. Build with the class methods, e.g. ``Compare.absent("controller")``."""

    key: str
    target: Literal["version", "create", "mod", "value", "lease"]
    op: CompareOp
    operand: int | bytes

    @classmethod
    def value(cls, key: str, value: bytes | str, op: CompareOp = "==") -> Compare:
        return cls(key, "value", op, to_bytes(value))

    @classmethod
    def version(cls, key: str, version: int, op: CompareOp = "==") -> Compare:
        return cls(key, "version", op, version)

    @classmethod
    def create_revision(cls, key: str, revision: int, op: CompareOp = "==") -> Compare:
        return cls(key, "create", op, revision)

    @classmethod
    def mod_revision(cls, key: str, revision: int, op: CompareOp = "==") -> Compare:
        return cls(key, "mod", op, revision)

    @classmethod
    def lease(cls, key: str, lease: Any, op: CompareOp = "==") -> Compare:
        return cls(key, "lease", op, lease_id(lease))

    @classmethod
    def absent(cls, key: str) -> Compare:
        """True when ``key`` does not exist (its create revision is 0)."""
        return cls(key, "create", "==", 0)

    @classmethod
    def present(cls, key: str) -> Compare:
        """True when ``key`` exists."""
        return cls(key, "create", ">", 0)

    def to_pb(self, keyspace: KeySpace) -> Any:
        target, field = _TARGETS[self.target]
        pb = _rpc.Compare(result=_RESULTS[self.op], target=target, key=keyspace.encode(self.key))
        setattr(pb, field, self.operand)
        return pb


@dataclass(frozen=True, slots=True)
class Op:
    """One request inside a transaction. Build with :meth:`get`, :meth:`put`, :meth:`delete`, ..."""

    kind: Literal["get", "put", "delete"]
    key: str
    prefix: bool = False
    value: bytes = b""
    lease: int = 0

    @classmethod
    def get(cls, key: str) -> Op:
        return cls("get", key)

    @classmethod
    def get_prefix(cls, prefix: str) -> Op:
        return cls("get", prefix, prefix=True)

    @classmethod
    def put(cls, key: str, value: bytes | str, lease: Any = None) -> Op:
        return cls("put", key, value=to_bytes(value), lease=lease_id(lease))

    @classmethod
    def delete(cls, key: str) -> Op:
        return cls("delete", key)

    @classmethod
    def delete_prefix(cls, prefix: str) -> Op:
        return cls("delete", prefix, prefix=True)

    @property
    def is_write(self) -> bool:
        return self.kind != "get"

    def to_pb(self, keyspace: KeySpace) -> Any:
        if self.prefix:
            key, range_end = keyspace.prefix_range(self.key)
        else:
            key, range_end = keyspace.encode(self.key), b""
        if self.kind == "get":
            return _rpc.RequestOp(request_range=_rpc.RangeRequest(key=key, range_end=range_end))
        if self.kind == "put":
            return _rpc.RequestOp(request_put=_rpc.PutRequest(key=key, value=self.value, lease=self.lease))
        return _rpc.RequestOp(request_delete_range=_rpc.DeleteRangeRequest(key=key, range_end=range_end))


OpResult = tuple[KeyValue, ...] | int | None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did.

    ``succeeded``: whether the compares held (so the success branch ran); ``revision``: the store
    revision after the txn; ``results``: one entry per op of the branch that ran -- the matching
    keys for a get, ``None`` for a put, the number of deleted keys for a delete.
    """

    succeeded: bool
    revision: int
    results: tuple[OpResult, ...] = ()

    def kvs(self, index: int = 0) -> tuple[KeyValue, ...]:
        """The keys returned by the get at ``index`` (a convenience for the common failure read)."""
        result = self.results[index]
        if not isinstance(result, tuple):
            raise TypeError(f"op {index} of this txn was not a get")
        return result


def txn_request(
    keyspace: KeySpace,
    compares: tuple[Compare, ...],
    success: tuple[Op, ...],
    failure: tuple[Op, ...],
    guard: tuple[Compare, ...] = (),
) -> Any:
    """The ``TxnRequest`` for a txn; with a ``guard``, wrapped so a failed guard is detectable.

    Guard compares must hold for anything to happen. When the txn has compares of its own, the
    guard becomes an outer txn whose only success op is the inner txn (nested txns exist since
    etcd 3.3); the outer ``succeeded`` then says whether the guard held and the inner one whether
    the caller's compares did.
    """
    inner = _rpc.TxnRequest(
        compare=[c.to_pb(keyspace) for c in compares],
        success=[op.to_pb(keyspace) for op in success],
        failure=[op.to_pb(keyspace) for op in failure],
    )
    if not guard:
        return inner
    guard_pbs = [c.to_pb(keyspace) for c in guard]
    if not compares:
        # No compares of our own: the guard can take their place, no nesting needed.
        return _rpc.TxnRequest(compare=guard_pbs, success=inner.success)
    return _rpc.TxnRequest(compare=guard_pbs, success=[_rpc.RequestOp(request_txn=inner)])


def txn_result(keyspace: KeySpace, response: Any, *, guarded: bool, nested: bool) -> TxnResult | None:
    """The :class:`TxnResult` of a ``TxnResponse``; ``None`` when a guard failed."""
    revision = response.header.revision
    if guarded and not response.succeeded:
        return None
    if nested:
        response = response.responses[0].response_txn
    return TxnResult(
        succeeded=response.succeeded,
        revision=revision,
        results=tuple(_op_result(keyspace, r) for r in response.responses),
    )


def _op_result(keyspace: KeySpace, response_op: Any) -> OpResult:
    kind = response_op.WhichOneof("response")
    if kind == "response_range":
        return tuple(keyspace.key_value(kv) for kv in response_op.response_range.kvs)
    if kind == "response_delete_range":
        return response_op.response_delete_range.deleted
    return None
