"""deploy/k8s/base/storage-identity.py: a storage pod's node id and rack (the init step)."""

from __future__ import annotations

import tomllib
import urllib.error
from collections.abc import Callable
from email.message import Message

import pytest

from services.config import load_config
from storage_node.config import StorageNodeConfig
from tests.support.scripts import load_script
from tests.unit.deploy.k8s_objects import BASE

identity = load_script(BASE / "storage-identity.py", "storage_identity")
GetNode = Callable[[str], dict]  # identity.GetNode

ZONE = "topology.kubernetes.io/zone"


def node(labels: dict) -> GetNode:
    return lambda name: {"metadata": {"name": name, "labels": labels}}


def failing(exc: Exception) -> GetNode:
    def get_node(name):
        raise exc

    return get_node


@pytest.mark.parametrize(
    ("pod", "ordinal"),
    [("tributary-storage-0", 0), ("tributary-storage-2", 2), ("broker-17", 17), ("a-b-c-104", 104)],
)
def test_ordinal_is_the_pod_name_suffix(pod, ordinal):
    assert identity.ordinal_of(pod) == ordinal


@pytest.mark.parametrize("pod", ["tributary-storage", "tributary-storage-", "storage-01", "storage-x", ""])
def test_names_without_an_ordinal_are_refused(pod):
    with pytest.raises(identity.IdentityError):
        identity.ordinal_of(pod)


def test_node_id_adds_the_offset():
    env = {"POD_NAME": "tributary-storage-2", "NODE_ID_OFFSET": "100", "RACK": "r1"}
    assert identity.derive(env, None, print) == (102, "r1")


def test_hostname_stands_in_for_the_pod_name():
    assert identity.derive({"HOSTNAME": "tributary-storage-1", "RACK": "r"}, None, print)[0] == 1


def test_rack_is_the_zone_label_of_the_node():
    env = {"POD_NAME": "s-0", "NODE_NAME": "n1"}
    assert identity.derive(env, node({ZONE: "eu-west-1b"}), print) == (0, "eu-west-1b")


def test_rack_label_is_configurable():
    env = {"POD_NAME": "s-0", "NODE_NAME": "n1", "RACK_NODE_LABEL": "example.com/rack"}
    assert identity.derive(env, node({ZONE: "z", "example.com/rack": "r7"}), print)[1] == "r7"


@pytest.mark.parametrize(
    "get_node",
    [
        node({}),
        failing(OSError("connection refused")),
        failing(urllib.error.HTTPError("u", 403, "Forbidden", Message(), None)),
        None,
    ],
)
def test_unknown_rack_is_empty_with_a_warning(get_node):
    warnings = []
    env = {"POD_NAME": "s-3", "NODE_NAME": "n1"}
    assert identity.derive(env, get_node, warnings.append) == (3, "")
    assert len(warnings) == 1 and "no rack" in warnings[0]


def test_unknown_rack_fails_when_required():
    env = {"POD_NAME": "s-3", "NODE_NAME": "n1", "RACK_REQUIRED": "true"}
    with pytest.raises(identity.IdentityError):
        identity.derive(env, node({}), print)


def test_written_file_is_a_storage_node_config(tmp_path):
    target = tmp_path / "run" / "identity.toml"
    env = {"POD_NAME": "tributary-storage-4", "NODE_NAME": "n1", "IDENTITY_FILE": str(target)}
    assert identity.main(env, node({ZONE: 'zone "b"\\x'})) == 0
    config = load_config(StorageNodeConfig, file=target)
    assert (config.node_id, config.rack) == (4, 'zone "b"\\x')
    assert set(tomllib.loads(target.read_text())) == {"node_id", "rack"}


def test_bad_pod_name_fails_without_writing(tmp_path):
    target = tmp_path / "identity.toml"
    assert identity.main({"POD_NAME": "storage", "IDENTITY_FILE": str(target)}, node({})) == 1
    assert not target.exists()
