"""Record futures (sync and async, callbacks) and how clients find the gateways."""

import asyncio
import json
import threading

import pytest

from gateway.client.errors import NoServersError, RecordTooLargeError, RequestTimedOutError
from gateway.client.futures import FutureRecordMetadata, ProduceResult, wait_for_result
from gateway.client.servers import resolve_servers, split_addresses
from gateway.client.structs import RecordMetadata, TopicPartition

TP = TopicPartition("t", 3)


def futures_of(count=3):
    result = ProduceResult(TP)
    return result, [FutureRecordMetadata(result, i, 1000 + i) for i in range(count)]


def test_record_metadata_comes_from_the_batch_base_offset():
    result, futures = futures_of()
    assert not futures[0].is_done
    result.complete(base_offset=50, log_start_offset=7)
    assert [f.get(0) for f in futures] == [RecordMetadata("t", 3, 50 + i, 1000 + i, 7) for i in range(3)]
    assert futures[1].succeeded() and futures[1].value.topic_partition == TP


def test_log_append_time_replaces_the_create_time():
    result, futures = futures_of(1)
    result.complete(base_offset=0, log_append_time=99)
    assert futures[0].get(0).timestamp == 99


def test_acks_zero_gives_offset_minus_one():
    result, futures = futures_of(2)
    result.complete(base_offset=-1)
    assert [f.get(0).offset for f in futures] == [-1, -1]


def test_callbacks_and_errbacks():
    result, futures = futures_of(2)
    seen = []
    futures[0].add_callback(lambda tag, md: seen.append((tag, md.offset)), "ok")
    futures[0].add_errback(lambda exc: seen.append("never"))
    futures[1].add_delivery_callback(lambda err, md: seen.append((err, md.offset)))
    result.complete(base_offset=10)
    assert seen == [("ok", 10), (None, 11)]
    late = []
    futures[0].add_callback(late.append)  # already done: runs at once
    assert late == [futures[0].value]


def test_failures_reach_get_errbacks_and_await():
    result, futures = futures_of(1)
    errors = []
    futures[0].add_errback(errors.append)
    futures[0].add_delivery_callback(lambda err, md: errors.append((type(err), md)))
    result.complete(error=RecordTooLargeError("big"))
    assert isinstance(errors[0], RecordTooLargeError) and errors[1] == (RecordTooLargeError, None)
    with pytest.raises(RecordTooLargeError):
        futures[0].get(0)
    assert futures[0].failed() and futures[0].value is None

    async def awaited():
        return await futures[0]

    with pytest.raises(RecordTooLargeError):
        asyncio.run(awaited())


def test_a_failing_callback_does_not_stop_the_others():
    result, futures = futures_of(1)
    seen = []
    futures[0].add_callback(lambda md: 1 / 0)
    futures[0].add_callback(seen.append)
    result.complete(base_offset=0)
    assert len(seen) == 1


def test_get_times_out():
    _, futures = futures_of(1)
    with pytest.raises(RequestTimedOutError):
        futures[0].get(0.01)


def test_await_resolved_from_another_thread():
    result, futures = futures_of(1)

    async def scenario():
        threading.Timer(0.05, result.complete, kwargs={"base_offset": 5}).start()
        return await futures[0]

    assert asyncio.run(scenario()).offset == 5


def test_blocked_getters_are_woken_by_the_batch_completing_on_another_thread():
    result, futures = futures_of(3)
    got = {}
    waiting = [threading.Thread(target=lambda i=i: got.__setitem__(i, futures[i].get(10))) for i in range(3)]
    for thread in waiting:
        thread.start()
    # The batch completes while (or before) they block: either way each gets its own metadata.
    result.complete(base_offset=40)
    for thread in waiting:
        thread.join(10)
    assert {i: md.offset for i, md in got.items()} == {0: 40, 1: 41, 2: 42}
    assert result.wait(0) and futures[0].get(0).offset == 40, "done stays done, no blocking"


def test_wait_for_result_never_raises():
    result, _ = futures_of(1)
    result.complete(error=RecordTooLargeError())
    asyncio.run(wait_for_result(result))


# ---- servers ------------------------------------------------------------------------------------


def test_explicit_servers_win(tmp_path):
    env = {"TRIBUTARY_GATEWAY": "env:1"}
    assert resolve_servers("a:1, b:2", environ=env, data_dir=tmp_path) == ["a:1", "b:2"]
    assert resolve_servers(["c:3"], environ=env) == ["c:3"]


def test_environment_then_cluster_file(tmp_path):
    (tmp_path / "cluster.json").write_text(json.dumps({"gateway": "127.0.0.1:5,127.0.0.1:6"}))
    assert resolve_servers(None, environ={"TRIBUTARY_GATEWAY": "env:1"}, data_dir=tmp_path) == ["env:1"]
    assert resolve_servers(None, environ={}, data_dir=tmp_path) == ["127.0.0.1:5", "127.0.0.1:6"]
    assert resolve_servers(None, environ={"TRIBUTARY_DATA_DIR": str(tmp_path)}) == [
        "127.0.0.1:5",
        "127.0.0.1:6",
    ]


def test_no_servers_says_how_to_start_a_cluster(tmp_path):
    with pytest.raises(NoServersError, match="tributary cluster up"):
        resolve_servers(None, environ={}, data_dir=tmp_path)


@pytest.mark.parametrize("bad", ["localhost", "host:", ":9092", "h:p"])
def test_addresses_must_be_host_port(bad):
    with pytest.raises(ValueError):
        split_addresses(bad)
