"""The data port's append connection (``storage_node/fetch/appends.py``) over a real socket pair,
with a stand-in for the append path that can hold an append before or after its write: order per
partition, answers in completion order, and the bounds on what a connection may hold. Every test
runs twice: in plaintext, and over TLS (``storage_node/fetch/links.py``, mutual TLS)."""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import struct

import pytest

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append as frames
from services.tls import ClientTls, ReloadingSslContext, ServerTls, client_ssl_context
from storage_node.fetch.appends import AppendConnection, AppendLimits
from storage_node.fetch.links import PlainLink, TlsLink
from storage_node.fetch.server import FetchStats
from tests.support.certificates import new_ca, new_certificate
from tests.support.wait import async_wait_until

#: The contexts of the TLS run (server, client), or None in the plaintext run.
_tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    ca = new_ca(directory, "ca")
    server = new_certificate(directory, "ca", "node")
    client = new_certificate(directory, "ca", "gateway")
    return ServerTls(*server, client_ca_file=ca), ClientTls(ca, *client)


@pytest.fixture(autouse=True, params=["plaintext", "tls"])
def transport(request, certificates):
    global _tls
    server, client = certificates
    _tls = (
        (ReloadingSslContext(server).context, client_ssl_context(client)) if request.param == "tls" else None
    )
    yield request.param
    _tls = None


def run_async(test):
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def wrapper():
        asyncio.run(test())

    return wrapper


class HeldAppender:
    """Writes appends in call order into ``written``; an append whose first record byte is in
    ``hold_before`` waits for its event before writing (a transactional batch asking the
    coordinator), one in ``hold_after`` after writing (acks=all waiting for the ISR)."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int, bytes]] = []
        self.hold_before: dict[bytes, asyncio.Event] = {}
        self.hold_after: dict[bytes, asyncio.Event] = {}

    async def append(self, topic, partition, data, *, acks, timeout_s, leader_epoch=None, written=None):
        payload = bytes(data)
        if payload in self.hold_before:
            await self.hold_before[payload].wait()
        offset = sum(1 for t, p, _ in self.written if (t, p) == (topic, partition))
        self.written.append((topic, partition, payload))
        if written is not None:
            written()
        if payload in self.hold_after:
            await self.hold_after[payload].wait()
        return AppendResult(topic, partition, base_offset=offset, last_offset=offset, record_count=1)


class ImmediateAppender(HeldAppender):
    """A ``HeldAppender`` with ``append_now`` (as the node's handlers): an append that is not
    held before its write is written at once, without a coroutine; a held one answers None
    (it must wait), and one in ``broken`` raises (a bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.immediate: list[bytes] = []
        self.broken: set[bytes] = set()

    def append_now(self, topic, partition, data, *, acks, leader_epoch=None, written=None):
        payload = bytes(data)
        if payload in self.broken:
            raise RuntimeError(f"bug appending {payload!r}")
        if payload in self.hold_before or payload in self.hold_after:
            return None
        offset = sum(1 for t, p, _ in self.written if (t, p) == (topic, partition))
        self.written.append((topic, partition, payload))
        self.immediate.append(payload)
        if written is not None:
            written()
        return AppendResult(topic, partition, base_offset=offset, last_offset=offset, record_count=1)


def _request(
    correlation_id: int, *parts: tuple[str, int, bytes], timeout_ms: int = 1000, acks: Acks = Acks.ALL
) -> bytes:
    return frames.encode_request(
        frames.AppendRequest(
            correlation_id,
            acks,
            timeout_ms,
            tuple(frames.PartitionAppend(t, p, d) for t, p, d in parts),
        )
    )


async def _read(reader: asyncio.StreamReader) -> frames.AppendResponse:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    if frames.response_correlation_id(body) == -1:
        return frames.AppendResponse(-1, frames.connection_error(body), ())
    return frames.decode_response_body(body)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (a socketpair is AF_UNIX: a write after the peer
    closed fails at once, which TCP does not, and TLS's closing exchange would trip on it)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return server, client


async def _start(appender, limits=None, frame_timeout=5.0, idle_timeout=30.0):
    """A served connection: the fetch server's part (the TLS handshake, reading the first size
    and version) is done here as the server would."""
    server_sock, client_sock = _tcp_pair()
    server_sock.setblocking(False)
    loop = asyncio.get_running_loop()
    link: PlainLink | TlsLink
    if _tls is None:
        link = PlainLink(loop, server_sock)
        reader, writer = await asyncio.open_connection(sock=client_sock)
    else:
        link = TlsLink(loop, server_sock, _tls[0])
        handshake = asyncio.create_task(link.handshake())
        reader, writer = await asyncio.open_connection(
            sock=client_sock, ssl=_tls[1], server_hostname="localhost"
        )
        await handshake
    stats = FetchStats()
    connection = AppendConnection(
        link,
        appender,
        limits=limits or AppendLimits(),
        frame_timeout=frame_timeout,
        idle_timeout=idle_timeout,
        stats=stats,
    )

    async def run():
        head = bytearray(6)
        got = 0
        while got < 6:
            got += await link.recv_into(memoryview(head)[got:])
        (size,) = struct.unpack(">i", head[:4])
        try:
            await connection.serve(size, bytes(head[4:6]))
        finally:
            link.close()

    return reader, writer, stats, asyncio.create_task(run())


@run_async
async def test_a_partition_waits_for_its_earlier_append_that_is_held_before_writing():
    appender = HeldAppender()
    release = appender.hold_before[b"first"] = asyncio.Event()
    reader, writer, _, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"first")))
    writer.write(_request(2, ("t", 0, b"second")))
    writer.write(_request(3, ("t", 1, b"elsewhere")))
    # Another partition is not held up: answered while "first" waits.
    answer = await asyncio.wait_for(_read(reader), 5)
    assert answer.correlation_id == 3
    assert appender.written == [("t", 1, b"elsewhere")]
    release.set()
    answers = {(a := await asyncio.wait_for(_read(reader), 5)).correlation_id: a for _ in range(2)}
    assert [t for t in appender.written if t[1] == 0] == [("t", 0, b"first"), ("t", 0, b"second")]
    assert (answers[1].results[0].base_offset, answers[2].results[0].base_offset) == (0, 1)
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_acks_1_appends_whose_turn_has_come_are_written_at_once_in_order():
    appender = ImmediateAppender()
    release = appender.hold_before[b"held"] = asyncio.Event()
    reader, writer, _, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"a0"), ("t", 1, b"held"), ("t", 2, b"a2"), acks=Acks.LEADER))
    writer.write(_request(2, ("t", 0, b"b0"), ("t", 1, b"after-held"), acks=Acks.LEADER))
    # Partition 1's first append must wait (append_now says so), and a request's partitions go
    # one after another: request 2's partition 0 is written at once, its partition 1 waits.
    await async_wait_until(lambda: len(appender.written) == 2, timeout=5, what="two appends written")
    assert appender.immediate == [b"a0", b"b0"]
    release.set()
    answers = {(a := await asyncio.wait_for(_read(reader), 5)).correlation_id: a for _ in range(2)}
    assert [t for t in appender.written if t[1] == 1] == [("t", 1, b"held"), ("t", 1, b"after-held")]
    assert [(r.partition, r.base_offset) for r in answers[1].results] == [(0, 0), (1, 0), (2, 0)]
    assert [(r.partition, r.base_offset) for r in answers[2].results] == [(0, 1), (1, 1)]
    # The held partition's second append waited for its turn: the slow way, not append_now.
    assert appender.immediate == [b"a0", b"b0", b"a2"]
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_pipelined_acks_0_and_1_requests_are_served_as_read_in_order():
    # Requests whose turns have come are served in the turn they are read (no task each): a
    # run of them, pipelined in one write over two partitions, is written in arrival order and
    # answered -- every one, with its offsets -- without ever taking the waiting path.
    appender = ImmediateAppender()
    reader, writer, stats, task = await _start(appender)
    requests = [
        _request(i, ("t", i % 2, b"r%d" % i), ("u", 0, b"u%d" % i), acks=(Acks.NONE, Acks.LEADER)[i % 2])
        for i in range(1, 41)
    ]
    writer.write(b"".join(requests))
    answers = {}
    for _ in requests:
        answer = await asyncio.wait_for(_read(reader), 5)
        answers[answer.correlation_id] = answer
    assert sorted(answers) == list(range(1, 41))
    for i, answer in answers.items():
        t, u = answer.results
        assert (t.partition, t.base_offset, t.error) == (i % 2, (i - 1) // 2, None)
        assert (u.topic, u.base_offset, u.error) == ("u", i - 1, None)
    assert appender.immediate == [x for i in range(1, 41) for x in (b"r%d" % i, b"u%d" % i)]
    assert stats.appends == 40
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_a_long_run_of_requests_served_at_once_lets_the_loop_take_turns():
    # Requests served at once take no task, so nothing in flight ever stops the reading; the
    # connection must still let other work on the loop run while it serves a long pipeline.
    appender = ImmediateAppender()
    reader, writer, _, task = await _start(appender)
    count = 1000
    writer.write(b"".join(_request(i, ("t", 0, b"%d" % i), acks=Acks.LEADER) for i in range(1, count + 1)))
    seen: list[int] = []

    async def other_work():
        while len(appender.written) < count:
            seen.append(len(appender.written))
            await asyncio.sleep(0)

    await asyncio.wait_for(other_work(), 10)
    answers = [await asyncio.wait_for(_read(reader), 5) for _ in range(count)]
    assert sorted(a.correlation_id for a in answers) == list(range(1, count + 1))
    assert any(0 < n < count for n in seen), "the loop ran nothing else while the run was served"
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_an_immediate_append_that_raises_fails_only_its_partition():
    appender = ImmediateAppender()
    appender.broken.add(b"bad")
    reader, writer, _, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"ok"), ("t", 1, b"bad"), ("t", 2, b"ok2"), acks=Acks.LEADER))
    answer = await asyncio.wait_for(_read(reader), 5)
    ok, bad, ok2 = answer.results
    assert ok.error is None and ok2.error is None
    assert bad.error is not None and bad.error.reason == "UNKNOWN_SERVER_ERROR"
    writer.write(_request(2, ("t", 1, b"next"), acks=Acks.LEADER))  # its turn was given back
    answer = await asyncio.wait_for(_read(reader), 5)
    assert answer.results[0].error is None and ("t", 1, b"next") in appender.written
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_an_append_that_would_start_past_its_timeout_is_refused_and_not_written():
    # The gateway gives up on an append at its timeout and may retry it: written later, behind
    # a slow earlier append of its partition, it would be there twice.
    appender = HeldAppender()
    release = appender.hold_before[b"slow"] = asyncio.Event()
    reader, writer, stats, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"slow"), timeout_ms=5000))
    writer.write(_request(2, ("t", 0, b"late"), ("t", 1, b"free"), timeout_ms=200))
    writer.write(_request(3, ("t", 0, b"after"), timeout_ms=5000))
    answer = await asyncio.wait_for(_read(reader), 5)
    assert answer.correlation_id == 2
    late, free = answer.results
    assert late.error is not None and late.error.reason == "REQUEST_TIMED_OUT"
    assert free.error is None and ("t", 1, b"free") in appender.written
    assert [t for t in appender.written if t[1] == 0] == []  # "after" still waits for "slow"
    release.set()
    answers = {(a := await asyncio.wait_for(_read(reader), 5)).correlation_id: a for _ in range(2)}
    assert all(answers[c].results[0].error is None for c in (1, 3))
    assert [t for t in appender.written if t[1] == 0] == [("t", 0, b"slow"), ("t", 0, b"after")]
    assert stats.append_errors == 1
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_an_append_waiting_after_its_write_holds_up_no_other_answer():
    appender = HeldAppender()
    release = appender.hold_after[b"slow"] = asyncio.Event()
    reader, writer, _, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"slow")))
    writer.write(_request(2, ("t", 0, b"fast")))
    assert (await asyncio.wait_for(_read(reader), 5)).correlation_id == 2  # completion order
    assert [d for _, _, d in appender.written] == [b"slow", b"fast"]  # write order kept
    release.set()
    assert (await asyncio.wait_for(_read(reader), 5)).correlation_id == 1
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_past_the_in_flight_bound_the_connection_is_not_read():
    appender = HeldAppender()
    release = asyncio.Event()
    for i in range(4):
        appender.hold_after[b"%d" % i] = release
    limits = AppendLimits(max_in_flight_requests=2)
    reader, writer, stats, task = await _start(appender, limits)
    for i in range(4):
        writer.write(_request(i + 1, ("t", i, b"%d" % i)))
    await async_wait_until(lambda: len(appender.written) == 2, timeout=5, what="two appends started")
    for _ in range(50):  # let the server run: it must not read a third request
        await asyncio.sleep(0)
    assert len(appender.written) == 2 and stats.appends == 2
    release.set()
    answers = sorted([(await asyncio.wait_for(_read(reader), 5)).correlation_id for _ in range(4)])
    assert answers == [1, 2, 3, 4]
    writer.close()
    await asyncio.wait_for(task, 5)


@run_async
async def test_a_bad_frame_after_good_ones_is_refused_and_closes_once_they_are_answered():
    appender = HeldAppender()
    reader, writer, stats, task = await _start(appender)
    writer.write(_request(1, ("t", 0, b"ok")))
    writer.write(struct.pack(">ih", 1 << 30, frames.APPEND_VERSION))  # beyond the frame bound
    first = await asyncio.wait_for(_read(reader), 5)
    refused = await asyncio.wait_for(_read(reader), 5)
    assert first.correlation_id == 1 and first.results[0].error is None
    assert refused.correlation_id == -1 and isinstance(refused.error, errors.InvalidRequestError)
    assert await reader.read() == b""
    assert stats.append_errors == 1
    await asyncio.wait_for(task, 5)


@run_async
async def test_a_client_stalled_mid_frame_is_dropped_after_the_frame_timeout():
    appender = HeldAppender()
    reader, writer, _, task = await _start(appender, frame_timeout=0.2)
    frame = _request(1, ("t", 0, b"x" * 1000))
    writer.write(frame[:100])
    await asyncio.wait_for(task, 5)  # the server gave up on the frame
    assert await reader.read() == b""
    assert appender.written == []


@run_async
async def test_large_frames_sent_in_pieces_and_many_small_frames_in_one_write():
    appender = HeldAppender()
    reader, writer, _, task = await _start(appender)
    large = bytes(range(256)) * 1200  # ~300 KiB: beyond the read buffer
    frame = _request(1, ("t", 0, large))
    for i in range(0, len(frame), 7001):
        writer.write(frame[i : i + 7001])
        await writer.drain()
    small = b"".join(_request(2 + i, ("t", 1, b"s%d" % i)) for i in range(500))
    writer.write(small)
    answers = sorted([(await asyncio.wait_for(_read(reader), 5)).correlation_id for _ in range(501)])
    assert answers == list(range(1, 502))
    assert appender.written[0] == ("t", 0, large)
    assert [d for _, p, d in appender.written if p == 1] == [b"s%d" % i for i in range(500)]
    writer.close()
    await asyncio.wait_for(task, 5)


@pytest.mark.parametrize("beyond", [1, 2, 3, 4, 100])
def test_a_frame_just_beyond_the_read_buffer_takes_no_byte_of_the_next_frame(beyond):
    # A frame a few bytes too large for the read buffer is received into a buffer of its own:
    # that buffer must be exactly the frame's size, or the receive takes the next frame's first
    # bytes into it too (its size prefix lost: the connection reads garbage from there on).
    @run_async
    async def run():
        appender = ImmediateAppender()
        reader, writer, _, task = await _start(appender)
        empty = _request(1, ("t", 0, b""), acks=Acks.LEADER)
        body_size = (64 << 10) - 4 + beyond  # the frame's size prefix plus body: beyond the buffer
        value = bytes(range(256)) * (body_size // 256 + 1)
        large = _request(1, ("t", 0, value[: body_size - (len(empty) - 4)]), acks=Acks.LEADER)
        assert len(large) - 4 == body_size
        writer.write(large + _request(2, ("t", 0, b"next"), acks=Acks.LEADER))
        answers = [await asyncio.wait_for(_read(reader), 5) for _ in range(2)]
        assert sorted(a.correlation_id for a in answers) == [1, 2]
        assert [d for _, _, d in appender.written] == [value[: body_size - (len(empty) - 4)], b"next"]
        writer.close()
        await asyncio.wait_for(task, 5)

    run()


@run_async
async def test_one_at_a_time_requests_are_served_as_they_arrive_and_the_idle_timeout_counts_from_the_last():
    # In plaintext, the frames that arrive whole while the read loop waits for the next one are
    # served in the callback that received them (PlainLink.recv_into_kept's take): what such a
    # request gets must be what the read loop gives -- its answer, in order -- a frame that
    # arrives in pieces after them is put together by the read loop, and the idle timeout counts
    # from the last request, not from when the loop began to wait.
    appender = ImmediateAppender()
    reader, writer, stats, task = await _start(appender, idle_timeout=0.6)
    loop = asyncio.get_running_loop()
    for i in range(8):  # one at a time, for longer than the idle timeout in all
        writer.write(_request(i, ("t", 0, b"one-%d" % i), acks=Acks.LEADER))
        answer = await asyncio.wait_for(_read(reader), 5)
        assert (answer.correlation_id, answer.results[0].base_offset) == (i, i)
        await asyncio.sleep(0.1)
    halves = _request(8, ("t", 0, b"in-pieces"), acks=Acks.LEADER)
    writer.write(_request(9, ("t", 0, b"before-pieces"), acks=Acks.LEADER) + halves[:7])
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(halves[7:])
    answers = {(a := await asyncio.wait_for(_read(reader), 5)).correlation_id: a for _ in range(2)}
    assert (answers[9].results[0].base_offset, answers[8].results[0].base_offset) == (8, 9)
    quiet_from = loop.time()
    await asyncio.wait_for(task, 5)  # closed, idle
    assert loop.time() - quiet_from >= 0.6 - 0.05
    assert await reader.read() == b""
    assert [p for _, _, p in appender.written] == [b"one-%d" % i for i in range(8)] + [
        b"before-pieces",
        b"in-pieces",
    ]
    assert stats.appends == 10


@run_async
async def test_frames_taken_at_once_up_to_the_end_of_the_read_buffer_leave_the_next_frame_readable():
    # The frames that arrive while the read loop waits are served in the receiving callback
    # (plaintext): when they fill the read buffer to its end and leave only the first bytes of
    # the next frame's size there, the read loop must move those to the front to read the rest
    # -- not receive into the empty view left at the buffer's end (0 bytes: "peer closed").
    appender = ImmediateAppender()
    reader, writer, _, task = await _start(appender)
    first = _request(1, ("t", 0, b"first"), acks=Acks.LEADER)
    writer.write(first)
    assert (await asyncio.wait_for(_read(reader), 5)).correlation_id == 1  # the loop waits now
    room = (64 << 10) - len(first) - 2  # whole frames up to 2 bytes before the buffer's end
    fillers: list[bytes] = []
    while room - sum(map(len, fillers)) > 0:
        left = room - sum(map(len, fillers))
        frame = _request(2 + len(fillers), ("t", 0, b"x" * 4000), acks=Acks.LEADER)
        if left < 2 * len(frame):  # the last one sized to end exactly at ``room``
            frame = _request(
                2 + len(fillers), ("t", 0, b"x" * (left - (len(frame) - 4000))), acks=Acks.LEADER
            )
        fillers.append(frame)
    assert sum(map(len, fillers)) == room
    last_id = 2 + len(fillers)
    writer.write(b"".join(fillers) + _request(last_id, ("t", 0, b"last"), acks=Acks.LEADER))
    answers = sorted(
        [(await asyncio.wait_for(_read(reader), 5)).correlation_id for _ in range(len(fillers) + 1)]
    )
    assert answers == list(range(2, last_id + 1))
    assert appender.written[-1] == ("t", 0, b"last")
    writer.close()
    await asyncio.wait_for(task, 5)


@pytest.mark.parametrize(
    ("bad_frame", "refusal"),
    [
        (struct.pack(">ih", 2, frames.APPEND_VERSION), errors.InvalidRequestError),  # below the fixed size
        (struct.pack(">ih", 1 << 30, frames.APPEND_VERSION), errors.InvalidRequestError),  # beyond the bound
        (struct.pack(">ih", 64, frames.APPEND_VERSION + 7) + bytes(62), errors.UnsupportedVersionError),
    ],
    ids=["too-small", "too-large", "other-version"],
)
@pytest.mark.parametrize("arrival", ["with-a-good-frame", "alone-while-the-loop-waits"])
def test_a_bad_frame_is_refused_alike_by_the_read_loop_and_when_taken_at_once(bad_frame, refusal, arrival):
    # Whole bad frames reach both readers: written behind a good frame, the read loop meets it;
    # written alone while the loop waits with nothing buffered, the receiving callback
    # (_take_now, plaintext) meets it first and must leave it, unwritten, to the read loop, whose
    # refusal is the connection's answer (the two share _size_refusal/_version_refusal).
    async def run():
        appender = ImmediateAppender()
        reader, writer, stats, task = await _start(appender)
        good = _request(1, ("t", 0, b"good"), acks=Acks.LEADER)
        if arrival == "with-a-good-frame":
            writer.write(good + bad_frame)
        else:
            writer.write(good)
            assert (await asyncio.wait_for(_read(reader), 5)).correlation_id == 1
            await asyncio.sleep(0.05)  # the read loop waits for the next frame
            writer.write(bad_frame)
        answers = []
        while (answer := await asyncio.wait_for(_read(reader), 5)).correlation_id != -1:
            answers.append(answer.correlation_id)
        assert answers == ([1] if arrival == "with-a-good-frame" else [])
        assert isinstance(answer.error, refusal)
        assert await reader.read() == b""
        assert appender.written == [("t", 0, b"good")] and stats.append_errors == 1
        await asyncio.wait_for(task, 5)

    asyncio.run(run())
