"""An in-memory etcd (keys, revisions, compare-and-swap transactions) and a controller that writes
through it -- for unit tests of controller-term logic that must not need a server.

It keeps etcd's rules that the logic depends on: one revision counter bumped by every write
transaction, a key's create/mod revision and version, compares on a missing key seeing zeros,
all-or-nothing transactions. Writes can be made to fail, before or after they apply (etcd
unreachable mid-call: the caller cannot know which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services import errors
from services.etcd.txn import Compare, Op, TxnResult
from services.etcd.values import KeyValue


class FakeEtcd:
    def __init__(self) -> None:
        self.kvs: dict[str, KeyValue] = {}
        self.revision = 1
        self.writes = 0

    async def get(self, key: str) -> KeyValue | None:
        return self.kvs.get(key)

    async def get_prefix(self, prefix: str = "") -> tuple[list[KeyValue], int]:
        return [kv for key, kv in sorted(self.kvs.items()) if key.startswith(prefix)], self.revision

    def put_now(self, key: str, value: bytes) -> KeyValue:
        """A write from outside the code under test (the test setting the scene)."""
        self.revision += 1
        self._put(key, value)
        return self.kvs[key]

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        if not all(self._holds(c) for c in compares):
            return TxnResult(False, self.revision)
        if any(op.is_write for op in ops):
            self.revision += 1
            self.writes += 1
        for op in ops:
            if op.kind == "put":
                self._put(op.key, op.value)
            elif op.kind == "delete":
                for key in [k for k in self.kvs if (k.startswith(op.key) if op.prefix else k == op.key)]:
                    del self.kvs[key]
        return TxnResult(True, self.revision)

    def _put(self, key: str, value: bytes) -> None:
        old = self.kvs.get(key)
        self.kvs[key] = KeyValue(
            key,
            value,
            old.create_revision if old else self.revision,
            self.revision,
            (old.version + 1) if old else 1,
        )

    def _holds(self, compare: Compare) -> bool:
        kv = self.kvs.get(compare.key)
        if compare.target == "value":
            if kv is None:
                return False
            actual: int | bytes = kv.value
        else:
            actual = {
                "create": kv.create_revision if kv else 0,
                "mod": kv.mod_revision if kv else 0,
                "version": kv.version if kv else 0,
                "lease": kv.lease if kv else 0,
            }[compare.target]
        operand = compare.operand
        return {
            "==": actual == operand,
            "!=": actual != operand,
            ">": actual > operand,  # type: ignore[operator]
            "<": actual < operand,  # type: ignore[operator]
        }[compare.op]


class FakeController:
    """What controller-term components use of :class:`coordinator.controller.Controller`: its
    epoch and fenced transactions. ``fail`` decides, per write, whether it fails and whether it
    was applied first ("before" / "after"; None: it succeeds)."""

    def __init__(self, etcd: FakeEtcd, epoch: int = 1) -> None:
        self.etcd = etcd
        self.epoch = epoch
        self.fail: Callable[[Sequence[Op]], str | None] = lambda ops: None

    async def fenced_txn(self, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> TxnResult:
        failure = self.fail(ops)
        if failure == "before":
            raise errors.CoordinatorNotAvailableError("etcd is unavailable (injected, not applied)")
        result = await self.etcd.txn(compares, ops)
        if failure == "after":
            raise errors.CoordinatorNotAvailableError("etcd is unavailable (injected, applied)")
        return result
