"""The gateway's fetch-session bookkeeping (KIP-227), pure logic: which partitions a fetch
reads, which results it answers, where positions move, and the bounds."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from gateway.server.fetch_sessions import FetchSessions, SessionFetch
from services import errors
from services.dataport import protocol as dp


class Result(NamedTuple):
    """What a FetchedPartition says to ``complete``."""

    next_offset: int
    high_watermark: int = 100
    last_stable_offset: int = -1
    log_start_offset: int = 0
    error: errors.TributaryError | None = None


def full(*partitions: tuple[str, int, int], session_id: int = 0) -> dp.FetchRequest:
    return dp.FetchRequest(
        1,
        [dp.FetchPartition(t, p, offset, 0) for t, p, offset in partitions],
        session_id=session_id,
        session_epoch=dp.INITIAL_EPOCH,
    )


def incremental(session_id: int, epoch: int, *changed, forgotten=()) -> dp.FetchRequest:
    return dp.FetchRequest(
        1,
        [dp.FetchPartition(t, p, offset, 0) for t, p, offset in changed],
        session_id=session_id,
        session_epoch=epoch,
        forgotten=tuple(forgotten),
    )


def offsets(fetch: SessionFetch) -> list[tuple[str, int, int]]:
    return [(p.topic, p.partition, p.offset) for p in fetch.partitions]


def unchanged(fetch: SessionFetch) -> list[Result]:
    return [Result(p.offset) for p in fetch.partitions]


def opened(sessions: FetchSessions, *partitions) -> SessionFetch:
    fetch = sessions.begin(full(*partitions), 1000)
    assert fetch.full and fetch.session is not None
    assert sessions.complete(fetch, unchanged(fetch)) == list(range(len(partitions)))  # all answered
    return fetch


def test_a_full_fetch_opens_a_session_with_every_partition_and_answers_all():
    sessions = FetchSessions()
    fetch = opened(sessions, ("a", 0, 5), ("a", 1, 7))
    assert fetch.session is not None and fetch.session_id != 0
    assert offsets(fetch) == [("a", 0, 5), ("a", 1, 7)]
    assert all(p.max_bytes == 1000 for p in fetch.partitions)  # 0 = the default
    assert sessions.counts.opened == 1 and sessions.counts.full_fetches == 1


def test_incremental_fetches_read_the_whole_session_and_answer_only_what_changed():
    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5), ("a", 1, 7), ("a", 2, 9)).session
    assert session is not None
    fetch = sessions.begin(incremental(session.id, 1), 1000)
    assert not fetch.full and offsets(fetch) == [("a", 0, 5), ("a", 1, 7), ("a", 2, 9)]
    # a0 brings records, a1 nothing, a2 a new high watermark
    answered = sessions.complete(fetch, [Result(8), Result(7), Result(9, high_watermark=120)])
    assert answered == [0, 2]
    # positions follow the answers; the partition that brought records goes to the end
    fetch = sessions.begin(incremental(session.id, 2), 1000)
    assert offsets(fetch) == [("a", 1, 7), ("a", 2, 9), ("a", 0, 8)]
    nothing_new = [Result(7), Result(9, high_watermark=120), Result(8)]
    assert sessions.complete(fetch, nothing_new) == []  # an empty answer
    assert sessions.counts.incremental_fetches == 2


def test_errors_and_log_start_and_last_stable_offset_changes_are_answered_without_moving_positions():
    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5), ("a", 1, 7), ("a", 2, 9)).session
    assert session is not None
    fetch = sessions.begin(incremental(session.id, 1), 1000)
    results = [
        Result(5, error=errors.NotLeaderOrFollowerError("moved")),
        Result(7, log_start_offset=3),
        Result(9, last_stable_offset=50),
    ]
    assert sessions.complete(fetch, results) == [0, 1, 2]
    fetch = sessions.begin(incremental(session.id, 2), 1000)
    assert offsets(fetch) == [("a", 0, 5), ("a", 1, 7), ("a", 2, 9)]
    # the same error again is answered again (an error is always news)
    assert sessions.complete(fetch, results) == [0]


def test_a_changed_partition_is_updated_and_always_answered_and_forgotten_ones_leave():
    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5), ("a", 1, 7)).session
    assert session is not None
    fetch = sessions.begin(incremental(session.id, 1, ("a", 1, 2), ("b", 0, 0), forgotten=[("a", 0)]), 1000)
    assert offsets(fetch) == [("a", 1, 2), ("b", 0, 0)]
    assert sessions.complete(fetch, unchanged(fetch)) == [0, 1]  # seeked and added: both answered


def test_an_unknown_session_and_a_wrong_epoch_are_refused_with_kafkas_errors():
    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5)).session
    assert session is not None
    with pytest.raises(errors.FetchSessionIdNotFoundError):
        sessions.begin(incremental(session.id + 1, 1), 1000)
    for epoch in (0 + 2, 5):
        with pytest.raises(errors.InvalidFetchSessionEpochError, match="expects epoch 1"):
            sessions.begin(incremental(session.id, epoch), 1000)
    sessions.begin(incremental(session.id, 1), 1000)  # the right one still works


def test_one_fetch_at_a_time_per_session():
    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5)).session
    assert session is not None
    first = sessions.begin(incremental(session.id, 1), 1000)
    with pytest.raises(errors.InvalidFetchSessionEpochError, match="in flight"):
        sessions.begin(incremental(session.id, 2), 1000)
    sessions.complete(first, [Result(6)])
    assert offsets(sessions.begin(incremental(session.id, 2), 1000)) == [("a", 0, 6)]


def test_a_full_fetch_naming_a_session_replaces_it_and_a_fetch_in_flight_no_longer_touches_it():
    sessions = FetchSessions()
    old = opened(sessions, ("a", 0, 5)).session
    assert old is not None
    in_flight = sessions.begin(incremental(old.id, 1), 1000)
    new = sessions.begin(full(("a", 0, 0), session_id=old.id), 1000)
    assert len(sessions) == 1 and sessions.get(old.id) is None and new.session_id != old.id
    assert sessions.complete(in_flight, [Result(9)]) == [0]  # still answered, but the session is gone
    with pytest.raises(errors.FetchSessionIdNotFoundError):
        sessions.begin(incremental(old.id, 2), 1000)


def test_sessionless_fetches_keep_nothing():
    sessions = FetchSessions()
    fetch = sessions.begin(dp.FetchRequest(1, [dp.FetchPartition("a", 0, 5, 10)]), 1000)
    assert fetch.session is None and fetch.session_id == 0 and offsets(fetch) == [("a", 0, 5)]
    assert sessions.complete(fetch, [Result(5)]) == [0]
    assert len(sessions) == 0 and sessions.counts.full_fetches == 0


def test_sessions_per_connection_are_capped_by_evicting_the_least_recently_used():
    sessions = FetchSessions(max_sessions=2)
    first = opened(sessions, ("a", 0, 0)).session
    second = opened(sessions, ("b", 0, 0)).session
    assert first is not None and second is not None
    sessions.complete(sessions.begin(incremental(first.id, 1), 1000), [Result(0)])  # first used last
    third = opened(sessions, ("c", 0, 0)).session
    assert third is not None
    assert len(sessions) == 2 and sessions.get(second.id) is None and sessions.get(first.id) is not None
    assert sessions.counts.evicted == 1
    with pytest.raises(errors.FetchSessionIdNotFoundError):
        sessions.begin(incremental(second.id, 1), 1000)


def test_partitions_per_session_are_capped():
    sessions = FetchSessions(max_partitions=2)
    # a full fetch over the cap is served without a session
    fetch = sessions.begin(full(("a", 0, 0), ("a", 1, 0), ("a", 2, 0)), 1000)
    assert fetch.session is None and len(fetch.partitions) == 3 and sessions.counts.refused == 1
    session = opened(sessions, ("a", 0, 0), ("a", 1, 0)).session
    assert session is not None
    # replacing one partition by another stays within the cap
    fetch = sessions.begin(incremental(session.id, 1, ("a", 2, 0), forgotten=[("a", 0)]), 1000)
    sessions.complete(fetch, unchanged(fetch))
    # growing past it closes the session
    with pytest.raises(errors.FetchSessionIdNotFoundError, match="more than this gateway's 2"):
        sessions.begin(incremental(session.id, 2, ("a", 3, 0)), 1000)
    assert len(sessions) == 0


def test_a_partition_forgotten_many_times_counts_once_against_the_cap():
    sessions = FetchSessions(max_partitions=10)
    session = opened(sessions, *[("a", p, 0) for p in range(10)]).session
    assert session is not None
    grow = [("b", p, 0) for p in range(1000)]
    with pytest.raises(errors.FetchSessionIdNotFoundError, match="it would hold 1009 partitions"):
        sessions.begin(incremental(session.id, 1, *grow, forgotten=[("a", 0)] * 1000), 1000)
    assert len(sessions) == 0


def test_no_sessions_at_all_when_the_cap_is_zero():
    sessions = FetchSessions(max_sessions=0)
    fetch = sessions.begin(full(("a", 0, 0)), 1000)
    assert fetch.session is None and sessions.counts.refused == 1


def test_a_failed_fetch_closes_its_session_and_close_all_ends_every_session():
    sessions = FetchSessions()
    first = opened(sessions, ("a", 0, 0))
    assert first.session is not None
    fetch = sessions.begin(incremental(first.session.id, 1), 1000)
    sessions.fail(fetch)
    assert len(sessions) == 0 and fetch.session is not None and fetch.session.closed
    second = opened(sessions, ("a", 0, 0)).session
    assert second is not None
    sessions.close_all()
    assert len(sessions) == 0 and second.closed


def test_the_reads_of_an_incremental_fetch_follow_every_move_and_reuse_what_holds():
    # data_listener._partition_fetches keeps each partition's read on it while its fields hold:
    # an answer's move, a client's change and a max_bytes change must each give a new read.
    from gateway.server.data_listener import _partition_fetches

    sessions = FetchSessions()
    session = opened(sessions, ("a", 0, 5), ("a", 1, 7), ("a", 2, 9)).session
    assert session is not None
    first = sessions.begin(incremental(session.id, 1), 1000)
    reads = _partition_fetches(first)
    assert [(r.partition, r.offset, r.known_high_watermark, r.known_log_start_offset) for r in reads] == [
        (0, 5, 100, 0),
        (1, 7, 100, 0),
        (2, 9, 100, 0),
    ]
    # a0 brings records (moves to 8, high watermark 120); the others are quiet (no result)
    sessions.complete(first, [Result(8, high_watermark=120), None, None])
    second = sessions.begin(incremental(session.id, 2, ("a", 1, 3)), 1000)  # a seek of a1
    again = {r.partition: r for r in _partition_fetches(second)}
    assert (again[0].offset, again[0].known_high_watermark) == (8, 120)
    assert (again[1].offset, again[1].known_high_watermark) == (3, -1), "a changed partition is always read"
    assert again[2] is reads[2], "a partition nothing moved keeps its read"
    sessions.complete(second, [None, None, None])
    third = sessions.begin(
        dp.FetchRequest(1, [dp.FetchPartition("a", 2, 9, 50)], session_id=session.id, session_epoch=3), 1000
    )
    assert {r.partition: r.max_bytes for r in _partition_fetches(third)}[2] == 50
