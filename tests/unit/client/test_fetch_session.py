"""The SDK's fetch-session picture (KIP-227), pure logic, checked against the gateway's
bookkeeping: whatever the consumer asks for, the gateway reads exactly those partitions at
exactly those offsets."""

from __future__ import annotations

import random

from gateway.client.fetch_session import FetchSessionState
from gateway.server.fetch_sessions import FetchSessions
from services import errors
from services.dataport import protocol as dp


def wanted(offsets: dict[tuple[str, int], int], max_bytes: int = 100) -> dp.FetchRequest:
    return dp.FetchRequest(0, [dp.FetchPartition(t, p, o, max_bytes) for (t, p), o in offsets.items()])


def answer(session_id: int, results: list[tuple[str, int, int]], error_code: int = 0) -> dp.FetchResponse:
    return dp.FetchResponse(
        1,
        error_code,
        "",
        [dp.FetchPartitionResult(t, p, next_offset=o) for t, p, o in results],
        0,
        session_id,
    )


def test_the_first_fetch_is_full_then_only_the_difference_is_sent():
    state = FetchSessionState()
    first = state.request(wanted({("a", 0): 5, ("a", 1): 7}))
    assert first.session_epoch == dp.INITIAL_EPOCH and len(first.partitions) == 2
    state.answered(answer(42, [("a", 0, 10), ("a", 1, 7)]))
    assert state.session_id == 42 and state.epoch == 1
    # the consumer now wants a0 from 10 (what the gateway moved it to) and a1 from 7: nothing to say
    second = state.request(wanted({("a", 0): 10, ("a", 1): 7}))
    assert second.session_id == 42 and second.session_epoch == 1
    assert second.partitions == [] and second.forgotten == ()
    state.answered(answer(42, []))
    # a seek on a1, a0 no longer wanted, b0 new
    third = state.request(wanted({("a", 1): 3, ("b", 0): 0}))
    assert [(p.topic, p.partition, p.fetch_offset) for p in third.partitions] == [("a", 1, 3), ("b", 0, 0)]
    assert third.forgotten == (("a", 0),) and third.session_epoch == 2


def test_a_lost_answer_or_an_error_makes_the_next_fetch_full_replacing_the_session():
    state = FetchSessionState()
    state.request(wanted({("a", 0): 5}))
    state.answered(answer(42, [("a", 0, 5)]))
    state.request(wanted({("a", 0): 5}))
    state.reset()  # the answer was never read
    again = state.request(wanted({("a", 0): 5}))
    assert again.session_epoch == dp.INITIAL_EPOCH and again.session_id == 42  # closes 42
    state.answered(answer(43, [("a", 0, 5)]))
    state.request(wanted({("a", 0): 5}))
    state.answered(answer(43, [], error_code=70))
    assert state.full


def test_a_gateway_refusing_a_session_gets_full_fetches():
    state = FetchSessionState()
    state.request(wanted({("a", 0): 5}))
    state.answered(answer(dp.NO_SESSION_ID, [("a", 0, 9)]))
    assert state.full and state.request(wanted({("a", 0): 9})).partitions != []


def test_a_max_bytes_change_is_sent():
    state = FetchSessionState()
    state.request(wanted({("a", 0): 5}))
    state.answered(answer(42, [("a", 0, 5)]))
    assert len(state.request(wanted({("a", 0): 5}, max_bytes=200)).partitions) == 1


def test_a_partition_swapped_for_another_is_sent_and_the_old_one_forgotten():
    # As many partitions wanted as the session holds, one of them another: the count alone
    # must not pass for "nothing forgotten".
    state = FetchSessionState()
    state.request(wanted({("a", 0): 5, ("a", 1): 7}))
    state.answered(answer(42, [("a", 0, 5), ("a", 1, 7)]))
    swapped = state.request(wanted({("a", 0): 5, ("a", 2): 0}))
    assert [(p.topic, p.partition) for p in swapped.partitions] == [("a", 2)]
    assert swapped.forgotten == (("a", 1),)


def test_an_unchanged_partition_passed_again_as_the_same_tuple_is_not_sent():
    # The fetcher passes the very tuple it sent while the offset holds; an equal new one also counts.
    state = FetchSessionState()
    request = wanted({("a", 0): 5, ("a", 1): 7})
    state.request(request)
    state.answered(answer(42, [("a", 0, 9)]))
    again = state.request(
        request._replace(partitions=[dp.FetchPartition("a", 0, 9, 100), request.partitions[1]])
    )
    assert again.partitions == [] and again.forgotten == ()


def test_random_walks_against_the_gateway_read_exactly_what_the_consumer_wants():
    """A consumer that seeks, drops and adds partitions at random, loses answers and reconnects:
    every fetch the gateway serves reads exactly the partitions and offsets the consumer asked
    for, and the positions it answers match what a sessionless fetch would give."""
    rng = random.Random(7)
    logs = {("t", p): rng.randrange(0, 50) for p in range(12)}  # each partition's log end
    gateway = FetchSessions()
    state = FetchSessionState()
    positions = {key: 0 for key in logs}
    for _ in range(400):
        wanted_now = {k: o for k, o in positions.items() if rng.random() < 0.8}
        if rng.random() < 0.1:
            key = rng.choice(list(positions))
            positions[key] = wanted_now[key] = rng.randrange(0, 50)  # a seek
        request = state.request(wanted(wanted_now))
        try:
            fetch = gateway.begin(dp.decode_fetch_request(dp.encode_fetch_request(request)[4:]), 1)
        except (errors.FetchSessionIdNotFoundError, errors.InvalidFetchSessionEpochError) as exc:
            state.answered(dp.FetchResponse(1, exc.kafka_code, exc.message, [], 0, request.session_id))
            continue
        read = {(p.topic, p.partition): p.offset for p in fetch.partitions}
        assert read == wanted_now
        results = []
        for p in fetch.partitions:
            end = logs[(p.topic, p.partition)]
            step = rng.randrange(0, 5) if p.offset < end else 0
            results.append(_Result(p.offset + step, end))
        answered = gateway.complete(fetch, results)
        response = answer(
            fetch.session_id,
            [
                (fetch.partitions[i].topic, fetch.partitions[i].partition, results[i].next_offset)
                for i in answered
            ],
        )
        if rng.random() < 0.05:
            state.reset()  # the consumer gave up on this answer (a seek cancelled the fetch)
            continue
        if rng.random() < 0.02:
            gateway = FetchSessions()  # a new connection: sessions gone
            state = FetchSessionState()
            continue
        state.answered(response)
        for p in response.partitions:
            positions[(p.topic, p.partition)] = p.next_offset
        for key, offset in wanted_now.items():
            # a partition not answered stays where it was asked for
            assert positions[key] == next(
                (p.next_offset for p in response.partitions if (p.topic, p.partition) == key), offset
            )


class _Result:
    def __init__(self, next_offset: int, high_watermark: int) -> None:
        self.next_offset = next_offset
        self.high_watermark = high_watermark
        self.last_stable_offset = -1
        self.log_start_offset = 0
        self.error = None
