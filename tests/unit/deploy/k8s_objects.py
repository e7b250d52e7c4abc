"""Kubernetes objects of deploy/k8s: files, a minimal kustomize (to assemble a base), lookups.

Just enough kustomize to assemble a base without kubectl: its resources and the ConfigMaps its
``configMapGenerator`` makes (no patches or transforms; overlays are rendered by ``kubectl
kustomize`` where it is installed).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from tests.unit.deploy.wiring_checks import DEPLOY

K8S = DEPLOY / "k8s"
BASE = K8S / "base"
OVERLAYS = K8S / "overlays"
COMPONENTS = K8S / "components"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
KUSTOMIZE_KINDS = ("Kustomization", "Component")


def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def yaml_files(root: Path = K8S) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml"))


def kustomization(directory: Path) -> dict:
    return load_docs(directory / "kustomization.yaml")[0]


def assemble(directory: Path) -> list[dict]:
    """The resources of a kustomization plus its generated ConfigMaps (no patches or transforms)."""
    k = kustomization(directory)
    objects: list[dict] = []
    for resource in k.get("resources", []):
        path = directory / resource
        objects += assemble(path) if path.is_dir() else load_docs(path)
    for generator in k.get("configMapGenerator", []):
        data = {}
        for spec in generator.get("files", []):
            key, _, name = spec.rpartition("=")
            data[key or Path(name).name] = (directory / name).read_text()
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        labels = (generator.get("options") or {}).get("labels", {})
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"], "labels": dict(labels)},
                "data": data,
            }
        )
    return objects


def kubectl_render(directory: Path) -> list[dict]:
    """``kubectl kustomize DIR``. kubectl is part of the test machine (Debian's ``kubectl``
    package): without it the overlays and components could not be checked as Kubernetes renders
    them, so its absence fails the test rather than skipping it."""
    if shutil.which("kubectl") is None:
        raise AssertionError(
            "kubectl is needed to render the overlays and components (apt-get install kubectl)"
        )
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr[-3000:]}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def image_name(image: str) -> str:
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    return image[: len(image) - len(last)] + last.split(":", 1)[0]


def containers(obj: Mapping) -> list[tuple[dict, bool]]:
    """``[(container, is_init)]`` of a workload's pod template."""
    if obj.get("kind") not in WORKLOAD_KINDS:
        return []
    spec = pod_spec(obj)
    return [(c, True) for c in spec.get("initContainers", [])] + [
        (c, False) for c in spec.get("containers", [])
    ]


def pod_spec(workload: Mapping) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: Mapping) -> dict:
    return (workload["spec"]["template"].get("metadata") or {}).get("labels") or {}


def selects(selector: Mapping | None, labels: Mapping) -> bool:
    """``selector``: a Service's plain map or a LabelSelector (only matchLabels is understood)."""
    selector = selector or {}
    if "matchLabels" in selector or "matchExpressions" in selector:
        selector = selector.get("matchLabels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def name_of(obj: Mapping) -> str:
    return obj["metadata"]["name"]


def describe(obj: Mapping) -> str:
    return f"{obj['kind']}/{name_of(obj)}"


def replicas_of(workload: Mapping) -> int:
    return int(workload["spec"].get("replicas", 1))


class Bundle:
    """The objects of one deployment, looked up by kind and name (one namespace)."""

    def __init__(self, objects: Iterable[dict]) -> None:
        self.objects = [o for o in objects if o.get("kind") not in KUSTOMIZE_KINDS]

    def of_kind(self, *kinds: str) -> list[dict]:
        return [o for o in self.objects if o.get("kind") in kinds]

    def get(self, kind: str, name: str) -> dict | None:
        return next((o for o in self.of_kind(kind) if name_of(o) == name), None)

    @property
    def workloads(self) -> list[dict]:
        return self.of_kind(*WORKLOAD_KINDS)

    def selected(self, selector: Mapping | None) -> list[dict]:
        return [w for w in self.workloads if selects(selector, pod_labels(w))]


def container_ports(container: Mapping) -> dict[int, str | None]:
    return {p["containerPort"]: p.get("name") for p in container.get("ports", [])}


def has_port(container: Mapping, port: int | str) -> bool:
    ports = container_ports(container)
    return port in ports.values() if isinstance(port, str) else port in ports


def is_tributary_image(container: Mapping) -> bool:
    return image_name(container.get("image", "")).rsplit("/", 1)[-1] == "tributary"


def claim_volumes(workload: Mapping) -> set[str]:
    """Volumes backed by persistent volume claims."""
    names = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    return names | {v["name"] for v in pod_spec(workload).get("volumes", []) if "persistentVolumeClaim" in v}
