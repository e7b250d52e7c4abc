"""The one door to the generated etcd stubs (``etcdrpc``, built from ``protos/etcdrpc/``).

Everything else in :mod:`services.etcd` imports protobuf messages and stubs from here, so a
change in how the code is generated touches one file. The generated modules are git-ignored and
rebuilt by ``python -m services.codegen``; never edit them.
"""

from __future__ import annotations

from etcdrpc import kv_pb2, rpc_pb2, rpc_pb2_grpc

# Messages of etcdserverpb (rpc.proto).
Compare = rpc_pb2.Compare
CompactionRequest = rpc_pb2.CompactionRequest
DeleteRangeRequest = rpc_pb2.DeleteRangeRequest
LeaseGrantRequest = rpc_pb2.LeaseGrantRequest
LeaseKeepAliveRequest = rpc_pb2.LeaseKeepAliveRequest
LeaseKeepAliveResponse = rpc_pb2.LeaseKeepAliveResponse
LeaseRevokeRequest = rpc_pb2.LeaseRevokeRequest
LeaseTimeToLiveRequest = rpc_pb2.LeaseTimeToLiveRequest
PutRequest = rpc_pb2.PutRequest
RangeRequest = rpc_pb2.RangeRequest
RangeResponse = rpc_pb2.RangeResponse
RequestOp = rpc_pb2.RequestOp
ResponseOp = rpc_pb2.ResponseOp
StatusRequest = rpc_pb2.StatusRequest
StatusResponse = rpc_pb2.StatusResponse
TxnRequest = rpc_pb2.TxnRequest
TxnResponse = rpc_pb2.TxnResponse
WatchCancelRequest = rpc_pb2.WatchCancelRequest
WatchCreateRequest = rpc_pb2.WatchCreateRequest
WatchProgressRequest = rpc_pb2.WatchProgressRequest
WatchRequest = rpc_pb2.WatchRequest
WatchResponse = rpc_pb2.WatchResponse

# Messages of mvccpb (kv.proto).
PbKeyValue = kv_pb2.KeyValue
PbEvent = kv_pb2.Event

# Service stubs.
KVStub = rpc_pb2_grpc.KVStub
WatchStub = rpc_pb2_grpc.WatchStub
LeaseStub = rpc_pb2_grpc.LeaseStub
MaintenanceStub = rpc_pb2_grpc.MaintenanceStub

__all__ = [
    "CompactionRequest",
    "Compare",
    "DeleteRangeRequest",
    "KVStub",
    "LeaseGrantRequest",
    "LeaseKeepAliveRequest",
    "LeaseKeepAliveResponse",
    "LeaseRevokeRequest",
    "LeaseStub",
    "LeaseTimeToLiveRequest",
    "MaintenanceStub",
    "PbEvent",
    "PbKeyValue",
    "PutRequest",
    "RangeRequest",
    "RangeResponse",
    "RequestOp",
    "ResponseOp",
    "StatusRequest",
    "StatusResponse",
    "TxnRequest",
    "TxnResponse",
    "WatchCancelRequest",
    "WatchCreateRequest",
    "WatchProgressRequest",
    "WatchRequest",
    "WatchResponse",
    "WatchStub",
]
