"""Generate the Python gRPC code from ``protos/`` -- the one command (``tributary-codegen``).

The ``.proto`` sources live under ``protos/<package path>/`` so that protoc emits package-qualified
imports (``from tributary.v1 import common_pb2``) and no import patching is needed.  The output
lands in the repository root as the packages ``tributary`` (our contract) and ``etcdrpc`` (the
subset of etcd's v3 API we call).

``protos/grpc/`` and ``protos/google/`` hold verbatim copies of upstream protos (gRPC health
checking, ``google.rpc.Status`` and its error details) for clients in other languages. They are
never compiled here: Python has them from grpcio-health-checking and grpcio-status /
googleapis-common-protos, and generated ``grpc/`` or ``google/`` folders at the repository root
would shadow those packages.  Generated files are git-ignored and rebuilt on every install
(setup.py calls :func:`generate`), so they can never drift from the protos or be edited by hand.

This module imports only the standard library and grpc_tools: it runs inside the isolated build
environment before anything else of ours is importable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
#: The folders of ``protos/`` compiled into Python packages; the others are upstream copies.
GENERATED_PACKAGES = ("tributary", "etcdrpc")


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every ``.proto`` of the generated packages below ``proto_root``, sorted for a
    deterministic build."""
    return sorted(f for package in GENERATED_PACKAGES for f in (proto_root / package).rglob("*.proto"))


def generate(out_dir: Path = REPO_ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc (from grpcio-tools) over every proto; return the package folders written.

    Writes ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` plus an ``__init__.py`` in every
    generated folder so they import as regular packages.
    """
    import importlib.resources

    from grpc_tools import protoc  # imported late: only the build needs it

    files = proto_files(proto_root)
    if not files:
        raise SystemExit(f"no .proto files under {proto_root}")
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(f.relative_to(proto_root)) for f in files],
    ]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    folders = sorted({(out_dir / f.relative_to(proto_root)).parent for f in files})
    for folder in folders:
        # Every level between out_dir and the generated folder must be a package.
        level = folder
        while level != out_dir:
            init = level / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated from protos/ by tributary-codegen; do not edit."""\n')
            level = level.parent
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tributary-codegen", description="Generate the Python gRPC code from protos/."
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repo)")
    args = parser.parse_args(argv)
    for folder in generate(args.out):
        print(f"generated {folder.relative_to(args.out) if folder.is_relative_to(args.out) else folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
