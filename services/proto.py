"""The one import point for generated gRPC code (built from ``protos/`` by ``tributary-codegen``).

Everything else imports ``from services.proto import pb, gateway_grpc, ...`` so that the
generated package layout can change in one place.
"""

from services import pb
from tributary.v1 import coordinator_pb2, gateway_pb2, storage_pb2
from tributary.v1 import coordinator_pb2_grpc as coordinator_grpc
from tributary.v1 import gateway_pb2_grpc as gateway_grpc
from tributary.v1 import storage_pb2_grpc as storage_grpc

GATEWAY_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
STORAGE_SERVICE = storage_pb2.DESCRIPTOR.services_by_name["StorageNode"].full_name
COORDINATOR_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name

__all__ = [
    "COORDINATOR_SERVICE",
    "GATEWAY_SERVICE",
    "STORAGE_SERVICE",
    "coordinator_grpc",
    "gateway_grpc",
    "pb",
    "storage_grpc",
]
