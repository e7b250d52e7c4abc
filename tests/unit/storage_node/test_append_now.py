"""``StorageNodeHandlers.append_now``: the data port's append without an event-loop turn gives
what ``append`` gives (same checks, same write, same result), and declines (None, nothing
written) every append that would wait: acks=all, ``flush_before_ack``, a transactional batch
to verify. Real logs on disk, a standalone node leading its partitions."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.acks import Acks
from storage_node.handlers import StorageNodeHandlers
from storage_node.log.log_manager import LogManager
from storage_node.notifier import AppendNotifier
from storage_node.replication.manager import ReplicaManager
from tests import batch_faults
from tests.unit.storage_node.log_testkit import make_batch


def handlers_for(tmp_path, clock, **options) -> StorageNodeHandlers:
    logs = LogManager([tmp_path / "logs"], clock)
    notifier = AppendNotifier()
    handlers = StorageNodeHandlers(
        logs, notifier, ReplicaManager(0, logs, notifier, clock), standalone=True, **options
    )
    for partition in (0, 1):
        asyncio.run(handlers.create_partition("t", partition, {}))
    return handlers


class NeverAsked:
    async def verify_transaction(self, *args):
        raise AssertionError("append_now must not verify transactions")


def test_append_now_writes_and_answers_as_append_does(tmp_path, clock):
    handlers = handlers_for(tmp_path, clock)
    batch = make_batch(3)
    written = []
    now = handlers.append_now("t", 0, batch, acks=Acks.LEADER, written=lambda: written.append(1))
    later = asyncio.run(handlers.append("t", 1, batch, acks=Acks.LEADER, timeout_s=5))
    assert written == [1]
    assert now is not None and now.error is None
    assert (now.base_offset, now.last_offset, now.record_count) == (0, 2, 3)
    assert dataclasses.replace(now, partition=1) == later
    assert handlers.logs.get("t", 0).log_end_offset == 3
    assert (handlers.records_in, handlers.append_requests) == (6, 2)


def test_append_now_refuses_as_append_does_and_writes_nothing(tmp_path, clock):
    handlers = handlers_for(tmp_path, clock)
    refused = handlers.append_now("t", 0, make_batch(1) + batch_faults.control(), acks=Acks.NONE)
    missing = handlers.append_now("t", 7, make_batch(1), acks=Acks.LEADER)
    assert refused is not None and refused.error is not None and refused.error.reason == "INVALID_RECORD"
    assert missing is not None and missing.error is not None
    assert missing.error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
    assert handlers.logs.get("t", 0).log_end_offset == 0


@pytest.mark.parametrize(
    "options, acks, data",
    [
        ({}, Acks.ALL, make_batch(1)),
        ({"flush_before_ack": True}, Acks.LEADER, make_batch(1)),
        ({}, Acks.LEADER, batch_faults.transactional()),
    ],
    ids=["acks-all", "flush-before-ack", "transactional"],
)
def test_append_now_declines_what_would_wait_and_writes_nothing(tmp_path, clock, options, acks, data):
    handlers = handlers_for(tmp_path, clock, **options)
    handlers.transaction_verifier = NeverAsked()
    assert handlers.append_now("t", 0, data, acks=acks) is None
    assert handlers.logs.get("t", 0).log_end_offset == 0
    assert handlers.append_requests == 0


def test_without_a_verifier_a_transactional_batch_goes_at_once(tmp_path, clock):
    handlers = handlers_for(tmp_path, clock)  # standalone: no coordinator to ask
    result = handlers.append_now("t", 0, batch_faults.transactional(), acks=Acks.LEADER)
    assert result is not None and result.error is None and result.record_count == 3


class RecordingTelemetry:
    """The two calls the handlers make of StorageNodeInstruments around an append."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int, int]] = []
        self.ended: list[tuple[str, int, object]] = []

    def start_append(self, topic, partition, size):
        self.started.append((topic, partition, size))
        return None

    def end_append(self, span, topic, size, result):
        self.ended.append((topic, size, result))


def test_with_telemetry_an_immediate_append_is_observed_and_one_that_waits_is_not(tmp_path, clock):
    telemetry = RecordingTelemetry()
    handlers = handlers_for(tmp_path, clock, telemetry=telemetry)
    batch = make_batch(2)
    result = handlers.append_now("t", 0, batch, acks=Acks.LEADER)
    assert handlers.append_now("t", 0, batch, acks=Acks.ALL) is None  # append observes that one
    assert telemetry.started == [("t", 0, len(batch))]
    assert telemetry.ended == [("t", len(batch), result)]
