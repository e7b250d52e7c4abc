"""The stopping node's side of a controlled shutdown (storage_node/shutdown.py), against a fake
controller channel: asks again while partitions are left, gives up within its bounds, and waits
until it has applied the new roles itself."""

from __future__ import annotations

import asyncio

import pytest

from services import errors
from services.config import ConfigError
from storage_node.shutdown import ShutdownSettings, controlled_shutdown


class _Controller:
    """Answers each request with the next of ``answers`` (an error is raised)."""

    def __init__(self, answers, on_request=lambda: None) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[int, float]] = []
        self.on_request = on_request

    async def controlled_shutdown(self, broker_epoch: int, wait_s: float):
        self.requests.append((broker_epoch, wait_s))
        self.on_request()
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _run(channel, leading, **settings):
    return asyncio.run(controlled_shutdown(channel, 42, leading, ShutdownSettings(**settings)))


def test_asks_until_nothing_is_left_then_waits_for_its_own_roles():
    led = {("t", 0), ("t", 1), ("rf1", 0)}
    channel = _Controller(
        [([("t", 0), ("t", 1)], [("rf1", 0)]), ([], [("rf1", 0)])],
        # the controller's role push: the node follows the moved partitions after the 2nd request
        on_request=lambda: len(channel.requests) == 2 and led.difference_update({("t", 0), ("t", 1)}),
    )
    outcome = _run(channel, lambda: sorted(led), timeout_ms=5_000, max_retries=3)
    assert outcome.completed and outcome.attempts == 2
    assert outcome.remaining == () and outcome.kept == (("rf1", 0),)
    assert [epoch for epoch, _ in channel.requests] == [42, 42]  # its registration, every time
    assert all(0 < wait <= 5.0 for _, wait in channel.requests)


def test_an_unreachable_controller_is_asked_max_retries_more_times_then_the_node_stops_anyway():
    channel = _Controller([errors.CoordinatorNotAvailableError("no active controller is known")])
    outcome = _run(channel, lambda: [("t", 0)], timeout_ms=10_000, max_retries=2)
    assert not outcome.completed and outcome.attempts == 3 and len(channel.requests) == 3


def test_a_refused_request_is_not_repeated():
    channel = _Controller([errors.StaleBrokerEpochError("node 1: broker epoch 42 is not current")])
    outcome = _run(channel, lambda: [("t", 0)], timeout_ms=10_000, max_retries=3)
    assert not outcome.completed and outcome.attempts == 1


def test_the_timeout_bounds_the_wait_for_roles_that_never_arrive():
    channel = _Controller([([], [])])  # the controller says done, but no role push ever comes
    outcome = _run(channel, lambda: [("t", 0)], timeout_ms=200, max_retries=0)
    assert not outcome.completed and outcome.elapsed_s < 2.0


def test_negative_settings_are_refused():
    with pytest.raises(ConfigError):
        ShutdownSettings(timeout_ms=-1)
    with pytest.raises(ConfigError):
        ShutdownSettings(max_retries=-1)
