"""What a client in another language needs from ``protos/``: our contract plus verbatim copies of
the upstream protos it refers to (health checking, google.rpc.Status and its ErrorInfo), one
``go_package`` / ``java_package`` for the whole contract, and nothing that makes the Python
codegen shadow the real ``grpc`` or ``google`` packages."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2
from grpc_tools import protoc

from services import codegen
from services.proto import pb

PROTOS = codegen.PROTO_ROOT
CONTRACT = sorted((PROTOS / "tributary" / "v1").glob("*.proto"))
UPSTREAM = {
    "grpc/health/v1/health.proto": health_pb2,
    "google/rpc/status.proto": status_pb2,
    "google/rpc/error_details.proto": error_details_pb2,
}
GO_PACKAGE = "github.com/tributary-log/tributary/gen/go/tributary/v1;tributaryv1"
#: A Go import path in a module (host with a dot, then path elements), then ;package name.
GO_IMPORT_PATH = re.compile(r"^[a-z0-9.-]+\.[a-z]+(/[A-Za-z0-9._~-]+)+;[a-z][a-z0-9]*$")


def _option(path: Path, name: str) -> list[str]:
    return re.findall(rf'^option {name} = "([^"]*)";', path.read_text(), flags=re.MULTILINE)


def test_every_contract_file_has_the_same_real_go_and_java_package():
    assert len(CONTRACT) >= 6
    for path in CONTRACT:
        assert _option(path, "go_package") == [GO_PACKAGE], path.name
        assert _option(path, "java_package") == ["dev.tributary.v1"], path.name
    assert GO_IMPORT_PATH.match(GO_PACKAGE)
    # The import path ends in the proto package's version directory, as buf's lint expects.
    assert GO_PACKAGE.split(";")[0].endswith("/tributary/v1")


def _compile(files: list[str], tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    out = tmp_path / "set.pb"
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    status = protoc.main(
        [
            "protoc",
            f"-I{PROTOS}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            *files,
        ]
    )
    assert status == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@pytest.mark.parametrize("relative", sorted(UPSTREAM))
def test_upstream_protos_are_shipped_verbatim_and_match_what_python_speaks(relative, tmp_path):
    path = PROTOS / relative
    text = path.read_text()
    assert "Licensed under the Apache License, Version 2.0" in text
    shipped = {f.name: f for f in _compile([relative], tmp_path).file}[relative]
    installed = descriptor_pb2.FileDescriptorProto()
    UPSTREAM[relative].DESCRIPTOR.CopyToProto(installed)
    # The messages, enums and services the servers use are the ones shipped (same names, same
    # field numbers and types), so stubs generated from protos/ talk to them.
    assert shipped.package == installed.package
    assert _shape(installed) == _shape(shipped)


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict:
    """What the wire depends on: names, numbers, types and streaming, not options or comments."""

    def message(m):
        return {
            "fields": sorted((f.name, f.number, f.type, f.label, f.type_name) for f in m.field),
            "nested": sorted((n.name, str(message(n))) for n in m.nested_type),
            "enums": sorted((e.name, str(enum(e))) for e in m.enum_type),
        }

    def enum(e):
        return sorted((v.name, v.number) for v in e.value)

    return {
        "messages": {m.name: message(m) for m in file.message_type},
        "enums": {e.name: enum(e) for e in file.enum_type},
        "services": {
            s.name: sorted(
                (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in s.method
            )
            for s in file.service
        },
    }


def test_the_whole_folder_compiles_as_one_include_root(tmp_path):
    files = [str(p.relative_to(PROTOS)) for p in sorted(PROTOS.rglob("*.proto"))]
    names = {f.name for f in _compile(files, tmp_path).file}
    assert set(UPSTREAM) <= names
    assert {f"tributary/v1/{p.name}" for p in CONTRACT} <= names


def test_codegen_compiles_only_our_packages(tmp_path):
    compiled = {p.relative_to(PROTOS).parts[0] for p in codegen.proto_files()}
    assert compiled == set(codegen.GENERATED_PACKAGES)
    codegen.generate(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etcdrpc", "tributary"]


def test_group_state_is_an_enum_beside_kafkas_name():
    names = {v.name for v in pb.GroupState.DESCRIPTOR.values}
    assert names == {
        "GROUP_STATE_UNSPECIFIED",
        "GROUP_STATE_EMPTY",
        "GROUP_STATE_STABLE",
        "GROUP_STATE_PREPARING_REBALANCE",
    }
    for message in (pb.GroupListing, pb.DescribeGroupResponse):
        fields = message.DESCRIPTOR.fields_by_name
        assert fields["group_state"].enum_type is pb.GroupState.DESCRIPTOR
        assert fields["state"].type == fields["state"].TYPE_STRING  # kept: wire compatible


def test_the_coordinator_sends_each_state_as_both_forms():
    from coordinator.groups import model, serde

    for name, value in [
        (model.EMPTY, pb.GROUP_STATE_EMPTY),
        (model.STABLE, pb.GROUP_STATE_STABLE),
        (model.PREPARING_REBALANCE, pb.GROUP_STATE_PREPARING_REBALANCE),
    ]:
        listing = serde.listing_to_proto(model.GroupListing(group_id="g", state=name, member_count=0))
        assert (listing.state, listing.group_state) == (name, value)
