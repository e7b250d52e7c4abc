"""``tributary consume --group`` and ``tributary groups ...`` as users run them: a subprocess per
command against a detached local cluster (``tributary cluster up`` in a temporary directory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.local_cluster import LocalCluster

REPO = Path(__file__).resolve().parents[3]
RECORDS = 30


def tributary(
    data_dir: Path, *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(data_dir),
        timeout=timeout,
    )


def _env(data_dir: Path) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "TRIBUTARY_GATEWAY"}
    return {**environment, "TRIBUTARY_DATA_DIR": str(data_dir)}


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


def describe(data_dir: Path, group: str) -> dict:
    return json.loads(ok(tributary(data_dir, "groups", "describe", group, "--format", "json")).stdout)


def committed(described: dict) -> dict[int, int | None]:
    return {p["partition"]: p["committed_offset"] for p in described["partitions"]}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli-groups-cluster")
    try:
        ok(tributary(directory, "cluster", "up"))
        ok(tributary(directory, "topics", "create", "orders", "--partitions", "3"))
        lines = "\n".join(f"order {i}" for i in range(RECORDS)) + "\n"
        ok(tributary(directory, "produce", "orders", stdin=lines))
        yield directory
    finally:
        tributary(directory, "cluster", "down")
        LocalCluster.from_data_dir(directory).stop()  # whatever `down` could not stop


def test_consume_with_a_group_commits_and_groups_list_describe_reset_delete(data_dir):
    consumed = ok(
        tributary(
            data_dir,
            "consume",
            "orders",
            "--group",
            "billing",
            "--from-beginning",
            "--max-messages",
            str(RECORDS),
            "--timeout-ms",
            "20000",
        )
    )
    assert sorted(consumed.stdout.split("\n")[:-1]) == sorted(f"order {i}" for i in range(RECORDS))

    listed = ok(tributary(data_dir, "groups", "list")).stdout.splitlines()
    assert listed[0].split() == ["GROUP", "STATE", "MEMBERS"] and ["billing", "Empty", "0"] in [
        r.split() for r in listed
    ]
    assert {"group_id": "billing", "state": "Empty", "member_count": 0} in json.loads(
        ok(tributary(data_dir, "groups", "list", "--format", "json")).stdout
    )

    text = ok(tributary(data_dir, "groups", "describe", "billing")).stdout
    assert "Consumer group 'billing' has no active members." in text
    rows = [line.split() for line in text.splitlines() if line.startswith("orders ")]
    ends = {int(r[1]): int(r[3]) for r in rows}
    assert len(rows) == 3 and sum(ends.values()) == RECORDS
    assert all(r[2] == r[3] and r[4] == "0" for r in rows), "committed = log end, lag 0: close() committed"

    dry = ok(
        tributary(
            data_dir, "groups", "reset-offsets", "billing", "--topic", "orders", "--to-earliest", "--dry-run"
        )
    )
    assert [r.split()[3] for r in dry.stdout.splitlines()[1:]] == ["0", "0", "0"] and "Dry run" in dry.stderr
    assert committed(describe(data_dir, "billing")) == ends, "a dry run commits nothing"

    ok(tributary(data_dir, "groups", "reset-offsets", "billing", "--topic", "orders", "--to-offset", "2"))
    described = describe(data_dir, "billing")
    assert committed(described) == {p: min(2, end) for p, end in ends.items()}
    assert sum(p["lag"] for p in described["partitions"]) == RECORDS - sum(
        min(2, end) for end in ends.values()
    )
    again = ok(tributary(data_dir, "consume", "orders", "--group", "billing", "--timeout-ms", "4000"))
    assert len(again.stdout.splitlines()) == RECORDS - sum(min(2, end) for end in ends.values()), (
        "consumption resumed at the reset offsets"
    )

    ok(tributary(data_dir, "groups", "reset-offsets", "billing", "--topic", "orders", "--to-timestamp", "0"))
    assert committed(describe(data_dir, "billing")) == {p: 0 for p in ends}
    ok(tributary(data_dir, "groups", "reset-offsets", "billing", "--topic", "orders", "--to-latest"))
    assert committed(describe(data_dir, "billing")) == ends

    assert (
        ok(tributary(data_dir, "groups", "delete", "billing")).stdout.strip()
        == "Deleted consumer group billing."
    )
    assert "billing" not in ok(tributary(data_dir, "groups", "list")).stdout
    missing = tributary(data_dir, "groups", "describe", "billing")
    assert missing.returncode == 1 and "GROUP_ID_NOT_FOUND" in missing.stderr


def test_a_running_member_shows_in_describe_and_blocks_resets_until_it_leaves(data_dir):
    member = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "consume",
            "orders",
            "--group",
            "audit",
            "--from-beginning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=_env(data_dir),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            result = tributary(data_dir, "groups", "describe", "audit", "--format", "json")
            if result.returncode == 0:
                described = json.loads(result.stdout)
                if described["members"] and len(described["members"][0]["owned"]) == 3:
                    break
            assert time.monotonic() < deadline, (
                f"the member never held the topic: {result.stdout}{result.stderr}"
            )
            time.sleep(0.3)
        (only,) = described["members"]
        assert described["state"] == "Stable" and only["client_id"] == "tributary-console-consumer"
        assert {p["owner"] for p in described["partitions"]} == {only["member_id"]}
        refused = tributary(
            data_dir, "groups", "reset-offsets", "audit", "--topic", "orders", "--to-earliest"
        )
        assert refused.returncode == 1 and "NON_EMPTY_GROUP" in refused.stderr
        refused = tributary(data_dir, "groups", "delete", "audit")
        assert refused.returncode == 1 and "NON_EMPTY_GROUP" in refused.stderr
        member.send_signal(signal.SIGINT)  # Ctrl-C: close() commits and leaves the group
        out, err = member.communicate(timeout=30)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(10)
    assert member.returncode == 0, err
    assert len(out.splitlines()) == RECORDS and f"Processed a total of {RECORDS} messages" in err
    described = describe(data_dir, "audit")
    assert described["state"] == "Empty", "left at once, not after the session timeout"
    assert sum(committed(described).values()) == RECORDS
