import asyncio
import struct

from gateway.server.append_queue import AppendQueues, count_offsets
from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.records import RecordBatchBuilder, iter_batches

FAR = 1e12  # a deadline nobody reaches


def batch(*values: bytes) -> bytes:
    builder = RecordBatchBuilder()
    for v in values:
        builder.append(v, timestamp=1)
    return builder.build()


class FakeLog:
    """An appender over one partition per key: validates, assigns offsets, records each
    partition's append (``calls``) and each call (``rounds``: its partitions)."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.calls: list[tuple[int, bytes]] = []
        self.rounds: list[list[int]] = []
        self.next_offset: dict[int, int] = {}
        self.values: dict[int, list[bytes]] = {}

    async def append(self, topic, payloads, acks, deadline, settled):
        self.rounds.append(list(payloads))
        self.calls += payloads.items()
        await asyncio.sleep(self.delay)
        results = {}
        for partition, data in payloads.items():
            results[partition] = result = self._write(topic, partition, data)
            settled(partition, result)
        return results

    def _write(self, topic: str, partition: int, data: bytes) -> AppendResult:
        try:
            batches = list(iter_batches(data))
            for b in batches:
                b.validate()
        except errors.CorruptRecordError as exc:
            return AppendResult(topic, partition, error=exc)
        base = self.next_offset.get(partition, 0)
        for b in batches:
            self.values.setdefault(partition, []).extend(r.value or b"" for r in b.records())
            self.next_offset[partition] = self.next_offset.get(partition, 0) + b.last_offset_delta + 1
        return AppendResult(
            topic,
            partition,
            base_offset=base,
            last_offset=self.next_offset[partition] - 1,
            record_count=sum(b.record_count for b in batches),
        )


def run(coro):
    return asyncio.run(coro)


def test_count_offsets():
    assert count_offsets(batch(b"a", b"b") + batch(b"c")) == (3, 3)
    assert count_offsets(b"garbage") is None
    assert count_offsets(b"") is None


def test_requests_queued_behind_an_append_go_out_merged_and_in_order():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        futures = [queues.submit("t", 0, batch(b"0a", b"0b"), Acks.ALL, FAR)]
        await asyncio.sleep(0.001)  # the first append is in flight now
        futures += [
            queues.submit("t", 0, batch(f"{i}a".encode(), f"{i}b".encode()), Acks.ALL, FAR)
            for i in range(1, 10)
        ]
        results = await asyncio.gather(*futures)
        await queues.close()
        return log, results

    log, results = run(scenario())
    assert [r.base_offset for r in results] == list(range(0, 20, 2))
    assert [r.last_offset for r in results] == list(range(1, 20, 2))  # each request's own share
    assert all((r.topic, r.partition, r.record_count, r.error) == ("t", 0, 2, None) for r in results)
    assert len(log.calls) == 2  # the first alone, the nine queued behind it merged
    assert log.values[0] == [f"{i}{s}".encode() for i in range(10) for s in "ab"]


def test_partitions_are_independent():
    async def scenario():
        log = FakeLog(delay=0.05)
        out: set[int] = set()  # partitions whose append is in flight
        most_out = 0

        async def appender(topic, payloads, acks, deadline, settled):
            nonlocal most_out
            out.update(payloads)
            most_out = max(most_out, len(out))
            try:
                return await log.append(topic, payloads, acks, deadline, settled)
            finally:
                out.difference_update(payloads)

        queues = AppendQueues(appender)
        a = queues.submit("t", 0, batch(b"a"), Acks.ALL, FAR)
        b = queues.submit("t", 1, batch(b"b"), Acks.ALL, FAR)
        await asyncio.gather(a, b)
        return most_out

    # In parallel, not one after the other: both were in flight at once. (Not timed: under load
    # a 50 ms sleep overshot a 90 ms bound about once in a hundred runs.)
    assert run(scenario()) == 2


def test_a_failed_merged_append_is_resent_one_by_one():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        corrupt = bytearray(batch(b"bad"))
        corrupt[-1] ^= 1
        first = queues.submit("t", 0, batch(b"first"), Acks.ALL, FAR)
        rest = [
            queues.submit("t", 0, data, Acks.ALL, FAR) for data in (batch(b"x"), bytes(corrupt), batch(b"y"))
        ]
        return log, await first, await asyncio.gather(*rest)

    log, first, rest = run(scenario())
    assert first.base_offset == 0
    assert [(r.base_offset, type(r.error)) for r in rest] == [
        (1, type(None)),
        (-1, errors.CorruptRecordError),
        (2, type(None)),
    ]
    assert log.values[0] == [b"first", b"x", b"y"]


def test_unreadable_bytes_and_different_acks_are_not_merged():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        futures = [
            queues.submit("t", 0, batch(b"0"), Acks.ALL, FAR),
            queues.submit("t", 0, batch(b"1"), Acks.ALL, FAR),
            queues.submit("t", 0, b"junk", Acks.ALL, FAR),
            queues.submit("t", 0, batch(b"3"), Acks.ALL, FAR),
            queues.submit("t", 0, batch(b"4"), Acks.LEADER, FAR),
        ]
        results = await asyncio.gather(*futures)
        return log, results

    log, results = run(scenario())
    # 0 and 1 merge; the junk goes alone; 3 and 4 differ in acks.
    assert [len(list(iter_batches(data, allow_partial_tail=True))) for _, data in log.calls] == [2, 0, 1, 1]
    assert [r.base_offset for r in results] == [0, 1, -1, 2, 3]


def test_a_retriable_failure_fails_the_whole_group_with_it():
    async def scenario():
        calls = []

        async def appender(topic, payloads, acks, deadline, settled):
            calls.append(payloads)
            await asyncio.sleep(0.01)
            error = errors.LeaderNotAvailableError("no leader")
            return {p: AppendResult(topic, p, error=error) for p in payloads}

        queues = AppendQueues(appender)
        results = await asyncio.gather(*(queues.submit("t", 0, batch(b"v"), Acks.ALL, FAR) for _ in range(4)))
        return calls, results

    calls, results = run(scenario())
    assert len(calls) == 1  # merged, and no one-by-one resend: retrying was the appender's job
    assert all(isinstance(r.error, errors.LeaderNotAvailableError) for r in results)


def test_back_pressure_when_too_much_is_queued():
    async def scenario():
        log = FakeLog(delay=0.05)
        queues = AppendQueues(log.append, max_queued_bytes=200)
        queues.submit("t", 0, batch(bytes(150)), Acks.NONE, FAR)
        queues.submit("t", 0, batch(bytes(150)), Acks.NONE, FAR)
        waiter = asyncio.ensure_future(queues.wait_for_room())
        await asyncio.sleep(0.02)
        blocked = not waiter.done()
        await asyncio.wait_for(waiter, 1)
        await queues.close()
        return blocked

    assert run(scenario())


def test_ready_partitions_go_out_together_in_one_round_per_topic():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        futures = [queues.submit("t", p, batch(f"{p}".encode()), Acks.LEADER, FAR) for p in range(100)]
        futures.append(queues.submit("u", 100, batch(b"u"), Acks.LEADER, FAR))
        futures.append(queues.submit("t", 0, batch(b"again"), Acks.LEADER, FAR))  # merged into t-0's
        results = await asyncio.gather(*futures)
        await queues.close()
        return log, results

    log, results = run(scenario())
    # One call for topic t's 100 partitions (t-0's two requests merged), one for u.
    assert log.rounds == [list(range(100)), [100]]
    assert log.values[0] == [b"0", b"again"]
    assert [r.base_offset for r in results[:100]] == [0] * 100
    assert results[-1].base_offset == 1 and results[-1].partition == 0


def test_a_settled_partition_moves_on_while_another_waits_for_its_retry():
    async def scenario():
        release = asyncio.Event()
        rounds = []

        async def appender(topic, payloads, acks, deadline, settled):
            rounds.append(sorted(payloads))
            results = {p: AppendResult(topic, p, base_offset=len(rounds)) for p in payloads}
            if 1 in payloads and len(rounds) == 1:
                settled(0, results[0])  # partition 0 is done; partition 1 "retries" until released
                await release.wait()
            for p, result in results.items():
                settled(p, result)
            return results

        queues = AppendQueues(appender)
        first = [queues.submit("t", p, batch(b"v"), Acks.LEADER, FAR) for p in (0, 1)]
        await asyncio.sleep(0.01)
        second = queues.submit("t", 0, batch(b"w"), Acks.LEADER, FAR)
        second_result = await asyncio.wait_for(second, 1)  # not held up by partition 1
        release.set()
        return rounds, await asyncio.gather(*first), second_result

    rounds, first, second = run(scenario())
    assert rounds[:2] == [[0, 1], [0]]
    assert [r.base_offset for r in first] == [1, 1] and second.base_offset == 2


def test_a_round_is_cut_at_its_byte_bound():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append, max_round_bytes=600)
        futures = [queues.submit("t", p, batch(bytes(200)), Acks.LEADER, FAR) for p in range(5)]
        await asyncio.gather(*futures)
        return log

    log = run(scenario())
    assert log.rounds == [[0, 1], [2, 3], [4]]


def test_submit_all_answers_a_request_once_every_partition_has_its_result():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        first = queues.submit_all("t", {0: batch(b"a"), 1: batch(b"b", b"c")}, Acks.ALL, FAR)
        await asyncio.sleep(0.001)  # in flight: the next request's partition 0 waits for it
        corrupt = bytearray(batch(b"bad"))
        corrupt[-1] ^= 1
        second = queues.submit_all("t", {0: batch(b"d"), 2: bytes(corrupt)}, Acks.ALL, FAR)
        empty = queues.submit_all("t", {}, Acks.ALL, FAR)
        assert empty.done() and empty.result() == {}
        answers = await asyncio.gather(first, second)
        await queues.close()
        return log, answers

    log, (first, second) = run(scenario())
    assert {p: (r.base_offset, r.record_count) for p, r in first.items()} == {0: (0, 1), 1: (0, 2)}
    assert (second[0].base_offset, second[0].error) == (1, None)  # after the first request's
    assert second[2].error is not None and second[2].error.reason == "CORRUPT_MESSAGE"
    assert log.values[0] == [b"a", b"d"]


def _counted_by_walking(data: bytes):
    """count_offsets as iter_batches' batch views have it (the reference)."""
    offsets = records = 0
    try:
        for view in iter_batches(data):
            offsets += view.last_offset_delta + 1
            records += view.record_count
    except errors.CorruptRecordError:
        return None
    return (offsets, records) if offsets else None


def test_count_offsets_reads_what_a_walk_of_batch_views_reads():
    import random

    rng = random.Random(19)
    whole = batch(b"a", b"b") + batch(b"c") + batch(*[b"v%d" % i for i in range(7)])
    cases = [whole, whole[:1], whole[:11], whole[:12], whole[:60], whole[:61], whole[:-1], b"\0" * 61]
    for _ in range(400):
        data = bytearray(whole[: rng.randrange(len(whole) + 1)])
        for _ in range(rng.randrange(3)):
            if data:  # damage a header field, the lengths included
                data[rng.randrange(min(len(data), rng.choice((70, len(data)))))] = rng.randrange(256)
        cases.append(bytes(data))
    for data in cases:
        assert count_offsets(data) == _counted_by_walking(data), data


def test_submit_then_calls_back_with_every_partition_and_survives_a_failing_callback():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        heard: list = []

        def broken(_results):
            raise RuntimeError("a caller's bug")

        queues.submit_then("t", {0: batch(b"a"), 1: batch(b"b", b"c")}, Acks.LEADER, FAR, heard.append)
        queues.submit_then("t", {0: batch(b"d")}, Acks.LEADER, FAR, broken)
        queues.submit_then("t", {0: batch(b"e")}, Acks.LEADER, FAR, heard.append)
        await queues.close()
        return heard, log

    heard, log = run(scenario())
    # (all three merged into one append of partition 0: the third is whole before the first,
    # which waits for partition 1 too)
    third, first = heard
    assert {p: (r.base_offset, r.error) for p, r in first.items()} == {0: (0, None), 1: (0, None)}
    assert (third[0].base_offset, third[0].error) == (2, None)  # after the one whose callback failed
    assert log.values[0] == [b"a", b"d", b"e"]


def test_requests_nobody_waits_for_are_appended_in_order_among_answered_ones():
    async def scenario():
        log = FakeLog()
        queues = AppendQueues(log.append)
        heard: list = []
        frame = b"xx" + batch(b"b")  # a view into a request frame, as the data listener passes
        queues.submit_then("t", {0: batch(b"a")}, Acks.NONE, FAR, None)
        queues.submit_then("t", {0: memoryview(frame)[2:]}, Acks.NONE, FAR, None)
        queues.submit_then("t", {0: batch(b"c")}, Acks.NONE, FAR, heard.append)
        await queues.close()
        # abandoned (cancelled with work left): nothing to tell, nothing raised
        queues.submit_then("t", {0: batch(b"d")}, Acks.NONE, FAR, None)
        queues._abandon(("t", 0), [])
        return heard, log

    heard, log = run(scenario())
    assert log.values[0] == [b"a", b"b", b"c"]
    assert [(r[0].error, r[0].record_count) for r in heard] == [(None, 3)]  # acks=0: shares unsplit


class CallbackLog(FakeLog):
    """FakeLog with an ``append_now``: each round's first attempt is answered from a callback
    (``call_later``, no task), its first answer for a partition in ``refuse_first`` a retriable
    NOT_LEADER (the appender's retry path then writes it); ``refuse_now`` makes ``append_now``
    decline (nothing sent)."""

    def __init__(self, refuse_first: frozenset[int] = frozenset(), refuse_now: bool = False) -> None:
        super().__init__()
        self.refuse_first = set(refuse_first)
        self.refuse_now = refuse_now
        self.now_rounds: list[list[int]] = []
        self.resumed: list[dict[int, AppendResult]] = []

    def append_now(self, topic, payloads, acks, deadline, done) -> bool:
        if self.refuse_now:
            return False
        self.now_rounds.append(list(payloads))

        def answer() -> None:
            results = {}
            for partition, data in payloads.items():
                if partition in self.refuse_first:
                    self.refuse_first.discard(partition)
                    results[partition] = AppendResult(
                        topic, partition, error=errors.NotLeaderOrFollowerError("moved")
                    )
                else:
                    results[partition] = self._write(topic, partition, data)
            done(results)

        asyncio.get_running_loop().call_later(self.delay, answer)
        return True

    async def append(self, topic, payloads, acks, deadline, settled, first=None):
        if first is None:
            return await super().append(topic, payloads, acks, deadline, settled)
        self.resumed.append(first)
        results = dict(first)
        for partition, result in first.items():
            if result.error is None:
                settled(partition, result)
        retry = {p: payloads[p] for p, r in first.items() if r.error is not None}
        results.update(await super().append(topic, retry, acks, deadline, settled))
        return results


def test_rounds_answered_from_callbacks_settle_in_order_without_an_appender_call():
    async def scenario():
        log = CallbackLog()
        queues = AppendQueues(log.append, append_now=log.append_now)
        first = [queues.submit("t", p, batch(b"a%d" % p), Acks.LEADER, FAR) for p in (0, 1)]
        await asyncio.sleep(0)  # the first round goes out; the next requests queue behind it
        later = [queues.submit("t", 0, batch(b"b%d" % i), Acks.LEADER, FAR) for i in range(3)]
        results = await asyncio.gather(*first, *later)
        await queues.close()
        return log, results

    log, results = run(scenario())
    assert log.rounds == []  # every round was started by append_now
    assert log.now_rounds == [[0, 1], [0]]  # the three queued behind went merged
    assert [r.base_offset for r in results] == [0, 0, 1, 2, 3]
    assert log.values[0] == [b"a0", b"b0", b"b1", b"b2"]


def test_a_callback_round_with_a_retriable_error_is_retried_by_the_appender_from_its_results():
    async def scenario():
        log = CallbackLog(refuse_first={1})
        queues = AppendQueues(log.append, append_now=log.append_now)
        answered = queues.submit_all("t", {0: batch(b"x"), 1: batch(b"y")}, Acks.LEADER, FAR)
        results = await answered
        await queues.close()
        return log, results

    log, results = run(scenario())
    assert len(log.resumed) == 1  # the appender went on from the first attempt's results
    assert isinstance(log.resumed[0][1].error, errors.NotLeaderOrFollowerError)
    assert log.rounds == [[1]]  # only the refused partition was sent again
    assert {p: (r.error, r.base_offset) for p, r in results.items()} == {0: (None, 0), 1: (None, 0)}
    assert log.values == {0: [b"x"], 1: [b"y"]}


def test_close_waits_for_rounds_answered_from_callbacks_and_a_declined_one_takes_a_task():
    async def scenario():
        log = CallbackLog()
        log.delay = 0.05
        queues = AppendQueues(log.append, append_now=log.append_now)
        queues.submit_then("t", {0: batch(b"v")}, Acks.LEADER, FAR, lambda results: None)
        await asyncio.sleep(0)  # the round goes out
        await queues.close()  # returns only once the callback came
        written = {p: list(v) for p, v in log.values.items()}
        log.refuse_now = True
        declined = await queues.submit("t", 0, batch(b"w"), Acks.LEADER, FAR)
        return log, written, declined

    log, written, declined = run(scenario())
    assert written == {0: [b"v"]}
    assert log.rounds == [[0]] and declined.base_offset == 1


def test_an_append_now_that_raises_leaves_the_round_to_the_appender_and_nothing_stuck():
    """A bug in the immediate path (before anything is sent) costs that round its shortcut, not
    its answer: the appender writes it, and requests queued behind it are served as usual."""

    class Raising(CallbackLog):
        def append_now(self, topic, payloads, acks, deadline, done) -> bool:
            raise struct.error("argument out of range")

    async def scenario():
        log = Raising()
        queues = AppendQueues(log.append, append_now=log.append_now)
        first = queues.submit("t", 0, batch(b"a"), Acks.LEADER, FAR)
        await asyncio.sleep(0)
        later = queues.submit("t", 0, batch(b"b"), Acks.LEADER, FAR)
        results = await asyncio.wait_for(asyncio.gather(first, later), 5)
        await queues.close()
        return log, results

    log, results = run(scenario())
    assert [(r.error, r.base_offset) for r in results] == [(None, 0), (None, 1)]
    assert log.values[0] == [b"a", b"b"] and log.rounds == [[0], [0]]


def test_held_rounds_start_at_release_in_the_same_callback_with_every_request_held():
    """The data listener serves one read's frames from its protocol's callback: their appends
    join one round, sent before the callback returns (no turn of the loop in between); a round
    already scheduled for the turn is joined instead, and unheld rounds still wait for the turn."""

    async def scenario():
        log = CallbackLog()
        queues = AppendQueues(log.append, append_now=log.append_now)
        queues.hold_rounds()
        try:
            first = [queues.submit("t", p, batch(b"a%d" % p), Acks.LEADER, FAR) for p in (0, 1)]
            assert log.now_rounds == []  # held
        finally:
            queues.release_rounds()
        sent_at_release = [list(r) for r in log.now_rounds]
        await asyncio.gather(*first)
        unheld = queues.submit("t", 0, batch(b"b"), Acks.LEADER, FAR)
        queues.hold_rounds()  # a round is scheduled already: the held request joins it
        joined = queues.submit("t", 1, batch(b"c"), Acks.LEADER, FAR)
        queues.release_rounds()
        before_the_turn = len(log.now_rounds)
        results = await asyncio.gather(unheld, joined)
        await queues.close()
        return log, sent_at_release, before_the_turn, results

    log, sent_at_release, before_the_turn, results = run(scenario())
    assert sent_at_release == [[0, 1]]
    assert before_the_turn == 1  # nothing sent before the loop's turn
    assert log.now_rounds == [[0, 1], [0, 1]]
    assert [(r.error, r.base_offset) for r in results] == [(None, 1), (None, 1)]
