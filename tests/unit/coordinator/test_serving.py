"""Serving helpers: the metadata memo, NOT_CONTROLLER answers, config descriptions, etcd health."""

import asyncio

import grpc

from coordinator.handlers import describe_configs
from coordinator.health import EtcdHealth
from coordinator.redirect import CONTROLLER_TRAILER, ControllerMovedError, not_controller_status
from coordinator.servicer import _RevisionMemo
from services import errors
from services.etcd.exceptions import EtcdUnavailableError
from services.topic_config import TOPIC_CONFIGS


def test_memo_reuses_answers_only_at_the_same_revision():
    memo = _RevisionMemo(max_entries=2)
    builds = []

    def build(tag):
        builds.append(tag)
        return tag

    assert memo.get_or_build(5, ("a",), lambda: build("a5")) == "a5"
    assert memo.get_or_build(5, ("a",), lambda: build("again")) == "a5"
    assert memo.get_or_build(6, ("a",), lambda: build("a6")) == "a6"
    assert builds == ["a5", "a6"]
    # Bounded: beyond max_entries answers are built but not kept.
    memo.get_or_build(6, ("b",), lambda: build("b6"))
    memo.get_or_build(6, ("c",), lambda: build("c6"))
    memo.get_or_build(6, ("c",), lambda: build("c6-again"))
    assert builds[-1] == "c6-again"


def test_not_controller_status_names_the_active_controller():
    moved = ControllerMovedError(
        "not me; the active controller is c2 at h:9", active_id="c2", active_address="h:9"
    )
    status = not_controller_status(moved)
    assert status.code == grpc.StatusCode.UNAVAILABLE
    metadata = dict(status.trailing_metadata)
    assert metadata[CONTROLLER_TRAILER] == "h:9"
    assert "grpc-status-details-bin" in metadata
    assert "[NOT_CONTROLLER]" in status.details and "c2 at h:9" in status.details
    assert isinstance(moved, errors.NotControllerError) and moved.retriable


def test_not_controller_status_without_a_known_controller_has_no_trailer():
    status = not_controller_status(ControllerMovedError("none elected"))
    assert CONTROLLER_TRAILER not in dict(status.trailing_metadata)


def test_describe_configs_set_ones_and_defaults():
    only_set = describe_configs({"retention.ms": "1000"}, include_defaults=False)
    assert [(c.name, c.value, c.is_default) for c in only_set] == [("retention.ms", "1000", False)]
    everything = {c.name: c for c in describe_configs({"retention.ms": "1000"}, include_defaults=True)}
    assert set(everything) == set(TOPIC_CONFIGS)
    assert everything["cleanup.policy"].value == "delete" and everything["cleanup.policy"].is_default
    assert everything["unclean.leader.election.enable"].value == "false"
    assert all(c.documentation for c in everything.values())


class _FakeEtcd:
    def __init__(self):
        self.outcomes = []

    async def status(self):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome == "hang":
            await asyncio.sleep(10)
        return outcome


class _Status:
    def __init__(self, has_leader):
        self.has_leader = has_leader


def test_health_follows_the_probe():
    async def scenario():
        etcd = _FakeEtcd()
        health = EtcdHealth(etcd, timeout=0.05)
        etcd.outcomes = [
            _Status(True),
            EtcdUnavailableError("connection refused"),
            "hang",
            _Status(False),
            _Status(True),
        ]
        assert await health.probe_once()
        health.ensure_available()
        assert not await health.probe_once()
        try:
            health.ensure_available()
            raise AssertionError("expected UNAVAILABLE")
        except errors.CoordinatorNotAvailableError as exc:
            assert "connection refused" in exc.message and exc.grpc_code == grpc.StatusCode.UNAVAILABLE
        assert not await health.probe_once()  # no answer within the timeout
        assert not await health.probe_once() and "no raft leader" in health.problem
        assert await health.probe_once()

    asyncio.run(scenario())
