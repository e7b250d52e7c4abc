"""Server reflection under ``grpc.reflection.v1`` as well as ``grpc.reflection.v1alpha``.

grpcio-reflection (1.85) implements only ``grpc.reflection.v1alpha.ServerReflection``, but newer
tools (grpcurl, Postman, grpc-js' and grpc-go's reflection clients) ask for
``grpc.reflection.v1.ServerReflection`` first. The two protocols are the same messages with the
same field numbers in another package (grpc-proto's ``grpc/reflection/v1/reflection.proto`` was
copied from v1alpha when it was promoted), so one servicer answers both: the v1 method is
registered with v1alpha's serializers, which read and write the identical bytes.

So that reflection can describe the v1 service itself, its file descriptor is derived from
v1alpha's -- renamed, repackaged, and every type reference rewritten -- and added to the default
descriptor pool once.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2

V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
V1_PACKAGE = "grpc.reflection.v1"
V1_FILE = "grpc/reflection/v1/reflection.proto"
#: The full name of the v1 service, as reflection lists it.
SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
_METHOD = "ServerReflectionInfo"


def v1_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """grpc.reflection.v1's FileDescriptorProto, derived from v1alpha's (same messages)."""
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = V1_FILE
    file.package = V1_PACKAGE
    file.ClearField("options")
    old, new = f".{V1ALPHA_PACKAGE}.", f".{V1_PACKAGE}."
    for message in file.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in file.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    return file


def register_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Add the v1 file to ``pool`` (the default pool) unless something already did."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.AddSerializedFile(v1_file_descriptor().SerializeToString())


def add_v1_to_server(servicer, server) -> None:
    """Serve ``servicer`` (grpcio-reflection's v1alpha servicer) as grpc.reflection.v1 too.

    ``server`` is anything with ``add_generic_rpc_handlers`` (a server, or
    :class:`services.grpc_decoding.DecodingRegistrar`).
    """
    register_v1_descriptor()
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {_METHOD: handler}),))
