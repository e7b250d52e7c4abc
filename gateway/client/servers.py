"""Where the gateways are: explicit ``servers``, then ``$TRIBUTARY_GATEWAY``, then the local cluster.

Every client and the CLI resolve addresses the same way, in this order:

1. ``servers=`` given to the client (``"host:port,host:port"`` or a list);
2. the ``TRIBUTARY_GATEWAY`` environment variable (same format);
3. the ``"gateway"`` entry of ``cluster.json`` in the local cluster's data directory, which
   ``tributary cluster up`` writes: ``$TRIBUTARY_DATA_DIR`` when set, else ``./.tributary``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.client.errors import NoServersError

GATEWAY_ENV = "TRIBUTARY_GATEWAY"
DATA_DIR_ENV = "TRIBUTARY_DATA_DIR"
#: The local cluster's data directory when ``$TRIBUTARY_DATA_DIR`` is not set (relative to the
#: working directory, like ``.git``), shared by the SDK and ``tributary cluster``.
DEFAULT_DATA_DIR = ".tributary"
CLUSTER_FILE = "cluster.json"
START_HINT = "start a local cluster with `tributary cluster up`"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$TRIBUTARY_DATA_DIR`` if set, else ``./.tributary``."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)


def split_addresses(servers: str | Sequence[str]) -> list[str]:
    """``"a:1, b:2"`` or ``["a:1", "b:2"]`` -> ``["a:1", "b:2"]``; every entry must be host:port."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = [item.strip() for item in items if item and item.strip()]
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"gateway address {address!r} is not host:port")
    return addresses


def cluster_file_gateways(data_dir: Path) -> list[str]:
    """The gateway addresses a local cluster wrote to ``data_dir/cluster.json`` (may be empty)."""
    try:
        described = json.loads((Path(data_dir) / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return []
    gateway = described.get("gateway") if isinstance(described, dict) else None
    return split_addresses(gateway) if isinstance(gateway, str) and gateway else []


def cluster_file_tls(data_dir: Path) -> dict[str, str]:
    """The admin client's TLS settings a local cluster started with ``--secure`` wrote to
    ``data_dir/cluster.json`` (empty: plaintext)."""
    try:
        described = json.loads((Path(data_dir) / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    tls = described.get("tls") if isinstance(described, dict) else None
    return {str(k): str(v) for k, v in tls.items()} if isinstance(tls, dict) else {}


def cluster_file_internal_tls(data_dir: Path) -> dict[str, str]:
    """The CLI's member certificate a local cluster started with ``--secure`` wrote to
    ``data_dir/cluster.json`` (``ssl_cafile``/``ssl_certfile``/``ssl_keyfile`` for the internal
    ports of storage nodes and coordinators; empty: plaintext)."""
    try:
        described = json.loads((Path(data_dir) / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    tls = described.get("internal_tls") if isinstance(described, dict) else None
    return {str(k): str(v) for k, v in tls.items()} if isinstance(tls, dict) else {}


def resolve_servers(
    servers: str | Sequence[str] | None = None,
    *,
    data_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The gateway addresses to use; raises :class:`NoServersError` saying how to fix it."""
    environ = os.environ if environ is None else environ
    if servers:
        return split_addresses(servers)
    if environ.get(GATEWAY_ENV):
        return split_addresses(environ[GATEWAY_ENV])
    directory = Path(data_dir) if data_dir is not None else default_data_dir(environ)
    found = cluster_file_gateways(directory)
    if found:
        return found
    raise NoServersError(
        f"no gateway address: pass servers='host:port', set {GATEWAY_ENV}, or {START_HINT} "
        f"(looked for {directory / CLUSTER_FILE})"
    )
