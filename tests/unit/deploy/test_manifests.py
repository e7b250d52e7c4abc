"""The Kubernetes manifests under deploy/k8s are wired to the code and to each other.

The base is assembled here (resources + generated ConfigMaps) and checked whole; overlays are
checked through their kustomization and, where kubectl is installed, rendered by ``kubectl
kustomize`` and checked whole as well. ``TestCheckerCatches`` breaks copies on purpose to show
each check can fail.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from tests.unit.deploy.docker_checks import DOCKERFILE, exposed_ports, parse_dockerfile, stages
from tests.unit.deploy.k8s_checks import bundle_problems, kustomization_problems, parse_problems
from tests.unit.deploy.k8s_objects import (
    BASE,
    COMPONENTS,
    K8S,
    OVERLAYS,
    Bundle,
    assemble,
    container_ports,
    kubectl_render,
    kustomization,
    pod_spec,
    replicas_of,
    yaml_files,
)
from tests.unit.deploy.wiring_checks import REPO, project_version

THREE_NODE = OVERLAYS / "three-node"
EXTERNAL_ETCD = COMPONENTS / "external-etcd"
INTERNAL_TLS = COMPONENTS / "internal-tls"


def running(bundle: Bundle, script: str) -> dict:
    """The one workload whose main container runs ``script``."""
    found = [
        w
        for w in bundle.workloads
        if any((c.get("command") or [""])[0] == script for c in pod_spec(w)["containers"])
    ]
    assert len(found) == 1, f"{script}: {len(found)} workloads"
    return found[0]


@pytest.fixture(scope="module")
def base_objects() -> list[dict]:
    return assemble(BASE)


@pytest.fixture(scope="module")
def base(base_objects) -> Bundle:
    return Bundle(base_objects)


# ---- every file ---------------------------------------------------------------------------------


def test_every_yaml_file_parses_into_kubernetes_objects():
    assert len(yaml_files()) >= 10
    assert parse_problems() == []


@pytest.mark.parametrize(
    "directory", [BASE, THREE_NODE, EXTERNAL_ETCD, INTERNAL_TLS], ids=lambda p: str(p.relative_to(K8S))
)
def test_kustomization_references_exist(directory):
    assert kustomization_problems(directory) == []


def test_every_kustomization_is_checked():
    found = {p.parent for p in K8S.rglob("kustomization.yaml")}
    assert found == {BASE, THREE_NODE, EXTERNAL_ETCD, INTERNAL_TLS, COMPONENTS / "gateway-tls"}


# ---- the base, whole ----------------------------------------------------------------------------


def test_base_is_wired(base_objects, entries, tmp_path):
    assert bundle_problems(base_objects, entries, tmp_path) == []


def test_base_runs_every_service_with_the_project_image(base):
    for script in ("tributary-storage-node", "tributary-coordinator", "tributary-gateway"):
        workload = running(base, script)
        for container in pod_spec(workload)["containers"]:
            assert container["image"] == f"tributary:{project_version()}"


def test_storage_nodes_are_a_statefulset_with_volumes_and_a_headless_service(base):
    storage = running(base, "tributary-storage-node")
    assert storage["kind"] == "StatefulSet"
    assert storage["spec"]["volumeClaimTemplates"]
    assert base.get("Service", storage["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_coordinators_and_gateways_are_deployments_behind_clusterip_services(base):
    coordinator, gateway = running(base, "tributary-coordinator"), running(base, "tributary-gateway")
    assert (coordinator["kind"], replicas_of(coordinator)) == ("Deployment", 2)
    assert gateway["kind"] == "Deployment" and replicas_of(gateway) >= 2
    assert base.get("Service", "tributary-gateway")["spec"]["type"] == "ClusterIP"
    assert base.get("Service", "tributary-coordinator")["spec"]["type"] == "ClusterIP"


def test_bundled_etcd_is_three_members_of_a_pinned_current_release(base):
    etcd = base.get("StatefulSet", "tributary-etcd")
    assert replicas_of(etcd) == 3
    image = pod_spec(etcd)["containers"][0]["image"]
    repository, _, tag = image.rpartition(":")
    assert repository in ("gcr.io/etcd-development/etcd", "quay.io/coreos/etcd")
    assert tag.startswith(("v3.5.", "v3.6.")) and tag != "v3.5.1"


def test_container_ports_match_the_image_defaults(base):
    """A container started without the ConfigMap would bind the image's ports: keep them the same."""
    runtime = stages(parse_dockerfile(DOCKERFILE.read_text()))[-1]
    ports = set()
    for script in ("tributary-storage-node", "tributary-coordinator", "tributary-gateway"):
        for container in pod_spec(running(base, script))["containers"]:
            ports |= set(container_ports(container))
    assert ports == exposed_ports(runtime)


def test_readme_lists_every_port():
    readme = (REPO / "deploy" / "README.md").read_text()
    runtime = stages(parse_dockerfile(DOCKERFILE.read_text()))[-1]
    for port in sorted(exposed_ports(runtime)) + [2379, 2380]:
        assert str(port) in readme


# ---- overlays -----------------------------------------------------------------------------------


def test_three_node_overlay_sets_three_storage_nodes(base):
    storage = running(base, "tributary-storage-node")
    counts = {r["name"]: r["count"] for r in kustomization(THREE_NODE).get("replicas", [])}
    assert counts.get(storage["metadata"]["name"]) == 3
    assert counts.get(running(base, "tributary-coordinator")["metadata"]["name"], 2) >= 2
    assert counts.get(running(base, "tributary-gateway")["metadata"]["name"], 2) >= 2


def test_three_node_overlay_renders_wired(entries, tmp_path):
    objects = kubectl_render(THREE_NODE)
    assert bundle_problems(objects, entries, tmp_path) == []
    bundle = Bundle(objects)
    assert replicas_of(running(bundle, "tributary-storage-node")) == 3
    namespace = kustomization(THREE_NODE)["namespace"]
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert {o["metadata"].get("namespace") for o in bundle.objects if o["kind"] not in cluster_scoped} == {
        namespace
    }


def test_external_etcd_component_removes_the_bundled_etcd(entries, tmp_path):
    """Enable the component the way deploy/README.md says, in a copy of the overlay."""
    k8s = tmp_path / "k8s"
    shutil.copytree(K8S, k8s)
    overlay = k8s / "overlays" / "three-node" / "kustomization.yaml"
    data = yaml.safe_load(overlay.read_text())
    data["components"] = ["../../components/external-etcd"]
    overlay.write_text(yaml.safe_dump(data))
    objects = kubectl_render(overlay.parent)
    bundle = Bundle(objects)
    assert not any(
        "etcd" in (c.get("image") or "") for w in bundle.workloads for c in pod_spec(w)["containers"]
    )
    assert bundle.get("Service", "tributary-etcd") is None
    assert bundle_problems(objects, entries, tmp_path / "scratch") == []


def _with_component(tmp_path, component: str) -> list[dict]:
    """The three-node overlay rendered with ``component`` enabled the way deploy/README.md says
    (in a copy of the tree)."""
    k8s = tmp_path / "k8s"
    shutil.copytree(K8S, k8s)
    overlay = k8s / "overlays" / "three-node" / "kustomization.yaml"
    data = yaml.safe_load(overlay.read_text())
    data["components"] = [f"../../components/{component}"]
    overlay.write_text(yaml.safe_dump(data))
    return kubectl_render(overlay.parent)


@pytest.fixture(scope="module")
def internal_tls_objects(tmp_path_factory) -> list[dict]:
    return _with_component(tmp_path_factory.mktemp("internal-tls"), "internal-tls")


def test_internal_tls_component_gives_every_service_the_member_certificate(
    internal_tls_objects, entries, tmp_path
):
    assert bundle_problems(internal_tls_objects, entries, tmp_path) == []
    bundle = Bundle(internal_tls_objects)
    config = bundle.get("ConfigMap", "tributary-config")["data"]
    for script, prefix in (
        ("tributary-storage-node", "STORAGE"),
        ("tributary-coordinator", "COORDINATOR"),
        ("tributary-gateway", "GATEWAY"),
    ):
        spec = pod_spec(running(bundle, script))
        secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        assert secrets == {"internal-tls": "tributary-internal-tls"}, script
        for name in ("CERT_FILE", "KEY_FILE", "CA_FILE"):
            assert config[f"TRIBUTARY_{prefix}_INTERNAL_TLS_{name}"].startswith(
                "/etc/tributary/internal-tls/"
            )
        assert config[f"TRIBUTARY_{prefix}_INTERNAL_TLS_SERVER_NAME"] == "member.tributary.internal"
    # The TLS-only ports are probed on the plaintext health port instead.
    storage = pod_spec(running(bundle, "tributary-storage-node"))["containers"][0]
    assert {storage[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {9097}


def test_gateway_tls_component_mounts_the_public_certificate_and_probes_in_plaintext(entries, tmp_path):
    objects = _with_component(tmp_path, "gateway-tls")
    assert bundle_problems(objects, entries, tmp_path) == []
    bundle = Bundle(objects)
    config = bundle.get("ConfigMap", "tributary-config")["data"]
    spec = pod_spec(running(bundle, "tributary-gateway"))
    mounts = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert mounts == {"gateway-tls": "tributary-gateway-tls"}
    (gateway,) = spec["containers"]
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "gateway-tls"]
    assert "subPath" not in mount, "a subPath mount never sees a rotated Secret"
    for name in ("CERT_FILE", "KEY_FILE"):
        assert config[f"TRIBUTARY_GATEWAY_TLS_{name}"].startswith(mount["mountPath"] + "/")
    # TLS-only public ports: the probes use the plaintext health port the config opens.
    assert config["TRIBUTARY_GATEWAY_HEALTH_PORT"] == "9097"
    assert {gateway[p]["grpc"]["port"] for p in ("readinessProbe", "livenessProbe")} == {9097}


TLS_BREAKAGES = {
    "probe of a TLS-only port": (
        lambda o: _storage(o)["livenessProbe"]["grpc"].__setitem__("port", 9094),
        "livenessProbe probes port 9094, the health port is 9097",
    ),
    "no health port": (
        lambda o: _config(o).pop("TRIBUTARY_COORDINATOR_HEALTH_PORT"),
        "is TLS only and the kubelet's gRPC probes speak plaintext",
    ),
    "certificate off the Secret": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_INTERNAL_TLS_CA_FILE", "/tmp/ca.crt"),
        "internal_tls_ca_file /tmp/ca.crt is on no Secret volume",
    ),
    "subPath mount": (
        lambda o: next(m for m in _storage(o)["volumeMounts"] if m["name"] == "internal-tls").__setitem__(
            "subPath", "tls.crt"
        ),
        "mounted with subPath",
    ),
}


@pytest.mark.parametrize("breakage", sorted(TLS_BREAKAGES))
def test_the_checker_catches_a_broken_internal_tls_setup(breakage, internal_tls_objects, entries, tmp_path):
    broken = copy.deepcopy(internal_tls_objects)
    mutate, expected = TLS_BREAKAGES[breakage]
    mutate(broken)
    problems = bundle_problems(broken, entries, tmp_path)
    assert any(expected in p for p in problems), problems


# ---- the checker can fail -----------------------------------------------------------------------


def _find(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(objects: list[dict], kind: str, name: str, container: str) -> dict:
    spec = pod_spec(_find(objects, kind, name))
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container)


def _storage(o):
    return _container(o, "StatefulSet", "tributary-storage", "storage-node")


def _config(o):
    return _find(o, "ConfigMap", "tributary-config")["data"]


def _set_env(container: dict, name: str, value: str) -> None:
    next(e for e in container["env"] if e["name"] == name)["value"] = value


BREAKAGES = {
    "unknown flag": (lambda o: _storage(o)["args"].__setitem__(0, "--conf"), "has no flag --conf"),
    "unknown console script": (
        lambda o: _container(o, "Deployment", "tributary-gateway", "gateway").__setitem__(
            "command", ["tributary-gw"]
        ),
        "tributary-gw is not a console script",
    ),
    "service targetPort": (
        lambda o: _find(o, "Service", "tributary-gateway")["spec"]["ports"][0].__setitem__(
            "targetPort", "grcp"
        ),
        "targets 'grcp'",
    ),
    "probe port": (
        lambda o: _storage(o)["livenessProbe"]["grpc"].__setitem__("port", 9095),
        "livenessProbe probes port 9095",
    ),
    "probe kind": (
        lambda o: _container(o, "Deployment", "tributary-coordinator", "coordinator").__setitem__(
            "readinessProbe", {"tcpSocket": {"port": 9093}}
        ),
        "readinessProbe is not a grpc probe",
    ),
    "volume mount": (lambda o: _storage(o)["volumeMounts"][0].__setitem__("name", "dat"), "volumeMount dat"),
    "statefulset service": (
        lambda o: _find(o, "StatefulSet", "tributary-storage")["spec"].__setitem__("serviceName", "brokers"),
        "serviceName 'brokers' is not a Service",
    ),
    "pdb selector": (
        lambda o: _find(o, "PodDisruptionBudget", "tributary-coordinator")["spec"]["selector"][
            "matchLabels"
        ].__setitem__("app.kubernetes.io/component", "coordinators"),
        "Deployment/tributary-coordinator: no PodDisruptionBudget",
    ),
    "env name typo": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_LOG_DIR", "/x"),
        "no field 'log_dir'",
    ),
    "env prefix typo": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORGE_PORT", "1"),
        "is read by no service",
    ),
    "port setting vs container port": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_PORT", "9096"),
        "binds port=9096",
    ),
    "env shadows the ordinal": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_NODE_ID", "1"),
        "is overridden by the environment variable TRIBUTARY_STORAGE_NODE_ID",
    ),
    "rack label": (
        lambda o: _set_env(
            _container(o, "StatefulSet", "tributary-storage", "identity"), "RACK_NODE_LABEL", ""
        ),
        "rack is ''",
    ),
    "identity file": (
        lambda o: _set_env(
            _container(o, "StatefulSet", "tributary-storage", "identity"),
            "IDENTITY_FILE",
            "/tmp/identity.toml",
        ),
        "no init container writes it",
    ),
    "loopback host": (lambda o: _storage(o).__setitem__("env", []), "is loopback"),
    "data off the volume": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_LOG_DIRS", "/tmp/data"),
        "not on a persistent volume",
    ),
    "bad topic config": (
        lambda o: _config(o).__setitem__("TRIBUTARY_STORAGE_DEFAULT_TOPIC_CONFIGS", "retention=1"),
        "Unknown topic config name: retention",
    ),
    "coordinator address": (
        lambda o: _config(o).__setitem__("TRIBUTARY_GATEWAY_COORDINATORS", "tributary-gateway:9092"),
        "not tributary-coordinator",
    ),
    "etcd endpoints disagree": (
        lambda o: _config(o).__setitem__(
            "TRIBUTARY_COORDINATOR_ETCD_ENDPOINTS", "tributary-etcd-0.tributary-etcd:2379"
        ),
        "services disagree on etcd_endpoints",
    ),
    "etcd member count": (
        lambda o: _find(o, "StatefulSet", "tributary-etcd")["spec"].__setitem__("replicas", 5),
        "--initial-cluster lists",
    ),
    "anti-affinity": (
        lambda o: pod_spec(_find(o, "StatefulSet", "tributary-storage")).pop("affinity"),
        "no required pod anti-affinity",
    ),
    "missing limits": (
        lambda o: _container(o, "Deployment", "tributary-gateway", "gateway")["resources"].pop("limits"),
        "no resources.limits",
    ),
    "rbac subject": (
        lambda o: _find(o, "ClusterRoleBinding", "tributary-storage-node-reader")["subjects"][0].__setitem__(
            "name", "storage"
        ),
        "subject ServiceAccount storage does not exist",
    ),
    "short grace period": (
        lambda o: pod_spec(_find(o, "StatefulSet", "tributary-storage")).__setitem__(
            "terminationGracePeriodSeconds", 5
        ),
        "terminationGracePeriodSeconds below",
    ),
}


class TestCheckerCatches:
    @pytest.mark.parametrize("breakage", sorted(BREAKAGES))
    def test_broken_base(self, breakage, base_objects, entries, tmp_path):
        broken = copy.deepcopy(base_objects)
        mutate, expected = BREAKAGES[breakage]
        mutate(broken)
        problems = bundle_problems(broken, entries, tmp_path)
        assert any(expected in p for p in problems), problems

    def test_broken_copy_on_disk(self, tmp_path):
        k8s = tmp_path / "k8s"
        shutil.copytree(K8S, k8s)
        overlay = k8s / "overlays" / "three-node"
        text = (overlay / "kustomization.yaml").read_text()
        (overlay / "kustomization.yaml").write_text(
            text.replace("- path: storage-volume.yaml", "- path: storage-volumes.yaml")
        )
        (k8s / "base" / "gateway.yaml").unlink()
        assert any("gateway.yaml does not exist" in p for p in kustomization_problems(k8s / "base"))
        (k8s / "base" / "gateway.yaml").write_text((K8S / "base" / "gateway.yaml").read_text())
        assert any("storage-volumes.yaml does not exist" in p for p in kustomization_problems(overlay))

    def test_overlay_storage_count(self, tmp_path):
        k8s = tmp_path / "k8s"
        shutil.copytree(K8S, k8s)
        path = k8s / "overlays" / "three-node" / "kustomization.yaml"
        data = yaml.safe_load(path.read_text())
        data["replicas"] = [
            r | {"count": 2} if r["name"] == "tributary-storage" else r for r in data["replicas"]
        ]
        data["replicas"].append({"name": "tributary-brokers", "count": 3})
        path.write_text(yaml.safe_dump(data))
        assert {r["name"]: r["count"] for r in kustomization(path.parent)["replicas"]}[
            "tributary-storage"
        ] == 2
        assert any("tributary-brokers: no such" in p for p in kustomization_problems(path.parent))

    def test_overlay_patch_that_breaks_the_wiring(self, entries, tmp_path):
        """A patch in an overlay can break what the base got right; the rendered check sees it."""
        k8s = tmp_path / "k8s"
        shutil.copytree(K8S, k8s)
        overlay = k8s / "overlays" / "three-node"
        (overlay / "bad-port.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tributary-config\n"
            'data:\n  TRIBUTARY_GATEWAY_PORT: "8080"\n'
        )
        data = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        data["patches"].append({"path": "bad-port.yaml"})
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(data))
        problems = bundle_problems(kubectl_render(overlay), entries, tmp_path / "scratch")
        assert any("binds port=8080" in p for p in problems), problems
