"""Which package may import which: the layout's rules, checked on every module's imports (ast).

* The services -- ``storage_node``, ``coordinator``, ``gateway.server`` -- are separate
  processes that talk over gRPC and the fetch port: none imports another.
* ``services`` is the shared kernel they all build on: it imports none of them (nor the SDK,
  the CLI, the launcher or the Spark jobs).
* The SDK (``gateway.client``) runs in applications: it imports no server module.
* The CLI (``gateway.cli``) and the launcher it uses (``launcher``) import no server module
  either: the launcher starts services as processes, by module name.

Every import counts, also those inside functions, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULES = ("storage_node", "coordinator", "gateway.server")

#: package -> packages it must not import (a package also covers its subpackages).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "storage_node": ("coordinator", "gateway"),
    "coordinator": ("storage_node", "gateway"),
    "gateway.server": ("storage_node", "coordinator", "gateway.client", "gateway.cli", "launcher"),
    "services": ("storage_node", "coordinator", "gateway", "launcher", "spark_jobs"),
    "gateway.client": (*SERVER_MODULES, "gateway.cli", "launcher"),
    "gateway.cli": SERVER_MODULES,
    "launcher": SERVER_MODULES,
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module ``path`` (under ``root``) imports, anywhere in it; relative imports resolved."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # an __init__'s own package is its folder too
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            # ``from gateway import server`` imports gateway.server.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def violations(package: str, root: Path = REPO) -> list[str]:
    found = []
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        found += [
            f"{path.relative_to(root)} imports {imported}"
            for imported in sorted(imported_modules(path, root))
            for forbidden in FORBIDDEN[package]
            if _within(imported, forbidden) and not _within(imported, package)
        ]
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_imports(package):
    assert list((REPO / package.replace(".", "/")).rglob("*.py")), f"{package} has no modules"
    assert violations(package) == []


def test_the_checker_finds_planted_imports(tmp_path):
    """Each kind of import is seen (so an empty list above means something)."""
    module = tmp_path / "gateway" / "client" / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import json\n"
        "from gateway.server.routing import Router\n"
        "from services.acks import Acks\n"
        "def later():\n"
        "    import storage_node.log\n"
        "    from gateway import server\n"
        "    from ..cli import main\n"
    )
    assert violations("gateway.client", tmp_path) == [
        "gateway/client/planted.py imports gateway.cli",
        "gateway/client/planted.py imports gateway.cli.main",
        "gateway/client/planted.py imports gateway.server",
        "gateway/client/planted.py imports gateway.server.routing",
        "gateway/client/planted.py imports gateway.server.routing.Router",
        "gateway/client/planted.py imports storage_node.log",
    ]
