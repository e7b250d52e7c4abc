"""Work deferred to the end of the pass that hands out storage-node answers
(``gateway/server/answer_pass.py``): the data listener's answer writes join it."""

from __future__ import annotations

import threading

from gateway.server import answer_pass


def test_deferred_work_runs_once_at_the_end_of_the_outermost_pass_and_a_failure_stops_none():
    ran: list[str] = []

    def fail() -> None:
        ran.append("fail")
        raise RuntimeError("a writer's bug")

    assert answer_pass.defer(lambda: ran.append("outside")) is False  # no pass: not taken
    with answer_pass.handing_out():
        assert answer_pass.defer(lambda: ran.append("first"))
        with answer_pass.handing_out():  # a pass inside a pass is part of it
            assert answer_pass.defer(fail)
        assert ran == []  # nothing before the outermost pass ends
        assert answer_pass.defer(lambda: ran.append("last"))
    assert ran == ["first", "fail", "last"]
    assert answer_pass.defer(lambda: ran.append("after")) is False


def test_a_pass_on_one_thread_is_not_seen_on_another():
    seen: list[bool] = []
    with answer_pass.handing_out():
        other = threading.Thread(target=lambda: seen.append(answer_pass.defer(lambda: None)))
        other.start()
        other.join(5)
    assert seen == [False]
