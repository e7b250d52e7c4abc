"""Init step of a storage-node pod: its node id from the StatefulSet ordinal, its rack from its zone.

Runs in the ``identity`` init container of the ``tributary-storage`` StatefulSet (same image as the
node, standard library only) and writes a small TOML file that the node container reads with
``tributary-storage-node --config /run/tributary/identity.toml``:

    node_id = 2
    rack = "europe-west1-b"

* ``node_id`` = the ordinal at the end of the pod name (``tributary-storage-2`` -> 2) plus
  ``$NODE_ID_OFFSET`` (default 0). A StatefulSet pod keeps its name, and so its id and its volume,
  across restarts and reschedules: exactly what Kafka's ``node.id`` needs.
* ``rack`` (Kafka's ``broker.rack``) = ``$RACK`` when set; otherwise the label
  ``$RACK_NODE_LABEL`` (default ``topology.kubernetes.io/zone``) of the Kubernetes node the pod
  was scheduled on (``$NODE_NAME``), read from the API server with the pod's service-account token
  (the ``tributary-storage-node-reader`` ClusterRole allows ``get nodes``). The downward API
  cannot expose node labels, hence this lookup. If the lookup fails the rack is left empty with a
  warning, or the step fails when ``$RACK_REQUIRED`` is true. An empty ``$RACK_NODE_LABEL``
  turns the lookup off.

Environment settings (``TRIBUTARY_STORAGE_*``) override a config file, so the ConfigMap must not
set ``TRIBUTARY_STORAGE_NODE_ID`` or ``TRIBUTARY_STORAGE_RACK`` (tests/unit/deploy checks it).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

DEFAULT_IDENTITY_FILE = "/run/tributary/identity.toml"
DEFAULT_RACK_LABEL = "topology.kubernetes.io/zone"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_ORDINAL = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>0|[1-9][0-9]*)$")
_TRUE = {"1", "true", "yes", "on"}

#: ``get_node(name) -> Node object as a dict``; raises OSError when the API server cannot tell.
GetNode = Callable[[str], dict]


class IdentityError(RuntimeError):
    """The pod's identity cannot be derived (bad pod name, required rack missing)."""


def ordinal_of(pod_name: str) -> int:
    """``tributary-storage-2`` -> 2: the StatefulSet ordinal at the end of the pod name."""
    match = _ORDINAL.match(pod_name)
    if match is None:
        raise IdentityError(f"pod name {pod_name!r} does not end in a StatefulSet ordinal (<name>-<n>)")
    return int(match.group("ordinal"))


def node_label(node: Mapping, label: str) -> str:
    """The value of ``label`` on a Node object, or "" when the node does not carry it."""
    return str(((node.get("metadata") or {}).get("labels") or {}).get(label, ""))


def api_get_node(*, attempts: int = 5, timeout: float = 5.0) -> GetNode:
    """A :data:`GetNode` over the in-cluster API server and the mounted service-account token."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def get_node(name: str) -> dict:
        token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
        request = urllib.request.Request(
            f"{base}/api/v1/nodes/{urllib.parse.quote(name, safe='')}",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        for attempt in range(attempts):
            try:
                with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError:
                raise  # 403 (no RBAC) or 404 will not change by retrying
            except (OSError, ValueError):
                if attempt == attempts - 1:
                    raise
                time.sleep(min(2.0**attempt, 5.0))
        raise AssertionError("unreachable")

    return get_node


def rack_of(env: Mapping[str, str], get_node: GetNode | None, warn: Callable[[str], None]) -> str:
    """``$RACK``, else the node label, else "" (or IdentityError when ``$RACK_REQUIRED``)."""
    if env.get("RACK"):
        return env["RACK"]
    label = env.get("RACK_NODE_LABEL", DEFAULT_RACK_LABEL)
    required = env.get("RACK_REQUIRED", "").strip().lower() in _TRUE
    node_name = env.get("NODE_NAME", "")
    problem = ""
    if not label:
        problem = "RACK_NODE_LABEL is empty (rack lookup off)"
    elif not node_name:
        problem = "NODE_NAME is not set"
    elif get_node is None:
        problem = "no API access"
    else:
        try:
            rack = node_label(get_node(node_name), label)
        except (OSError, ValueError) as exc:
            problem = f"cannot read node {node_name}: {exc}"
        else:
            if rack:
                return rack
            problem = f"node {node_name} has no label {label}"
    if required:
        raise IdentityError(f"rack required but unknown: {problem}")
    warn(f"storage-identity: no rack ({problem}); rack-aware placement will not see this node's zone")
    return ""


def render(node_id: int, rack: str) -> str:
    """The TOML file (JSON string escaping is valid TOML basic-string escaping)."""
    return f"node_id = {node_id}\nrack = {json.dumps(rack)}\n"


def derive(env: Mapping[str, str], get_node: GetNode | None, warn: Callable[[str], None]) -> tuple[int, str]:
    pod_name = env.get("POD_NAME") or env.get("HOSTNAME", "")
    offset = int(env.get("NODE_ID_OFFSET", "0") or 0)
    return ordinal_of(pod_name) + offset, rack_of(env, get_node, warn)


def main(env: Mapping[str, str] | None = None, get_node: GetNode | None = None) -> int:
    env = os.environ if env is None else env
    if get_node is None and (SERVICE_ACCOUNT_DIR / "token").exists():
        get_node = api_get_node()

    def warn(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        node_id, rack = derive(env, get_node, warn)
    except (IdentityError, ValueError) as exc:
        print(f"storage-identity: {exc}", file=sys.stderr)
        return 1
    target = Path(env.get("IDENTITY_FILE") or DEFAULT_IDENTITY_FILE)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(render(node_id, rack))
    tmp.replace(target)
    print(f"storage-identity: node_id={node_id} rack={rack!r} -> {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
