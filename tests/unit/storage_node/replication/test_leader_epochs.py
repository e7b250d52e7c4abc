from __future__ import annotations

import pytest

from storage_node.log.leader_epochs import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED,
    EpochEndOffset,
    EpochEntry,
    LeaderEpochCache,
    read_checkpoint,
)


def cache(*entries: tuple[int, int], path=None) -> LeaderEpochCache:
    return LeaderEpochCache(path, tuple(EpochEntry(*e) for e in entries))


def test_assign_is_a_no_op_for_the_latest_epoch_at_or_after_its_start():
    c = cache((0, 0), (2, 10))
    assert not c.assign(2, 10)
    assert not c.assign(2, 15)
    assert c.entries == ((0, 0), (2, 10))


def test_assign_of_a_new_epoch_appends():
    c = cache((0, 0))
    assert c.assign(3, 7)
    assert c.entries == ((0, 0), (3, 7))
    assert c.latest_epoch == 3


def test_assign_drops_entries_not_below_the_new_one_in_epoch_or_offset():
    # A follower that truncated learns the leader's history again: epoch 2 now starts at 5.
    c = cache((0, 0), (2, 10), (4, 20))
    assert c.assign(2, 5)
    assert c.entries == ((0, 0), (2, 5))
    # A later epoch starting below an existing entry's start replaces it too.
    c = cache((0, 0), (2, 10))
    c.assign(3, 8)
    assert c.entries == ((0, 0), (3, 8))


def test_assign_refuses_negative_values():
    with pytest.raises(ValueError):
        cache().assign(-1, 0)
    with pytest.raises(ValueError):
        cache().assign(0, -1)


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (4, EpochEndOffset(4, 50)),  # the latest epoch ends at the log end
        (2, EpochEndOffset(2, 30)),  # a known epoch ends where the next starts
        (3, EpochEndOffset(2, 30)),  # unknown epoch between: the largest known below it
        (0, EpochEndOffset(0, 10)),  # below every known epoch: it ends where the first starts
        (5, UNDEFINED),  # above every known epoch
        (-1, UNDEFINED),
    ],
)
def test_end_offset_for(epoch, expected):
    c = cache((1, 10), (2, 20), (4, 30))
    # epoch 2 runs 20..29, epoch 4 from 30 to the log end (50)
    assert c.end_offset_for(epoch, 50) == expected


def test_end_offset_for_on_an_empty_cache_is_undefined():
    assert cache().end_offset_for(0, 10) == UNDEFINED


def test_truncate_from_end_forgets_epochs_starting_at_or_after_the_cut():
    c = cache((0, 0), (2, 10), (4, 20))
    c.truncate_from_end(20)
    assert c.entries == ((0, 0), (2, 10))
    c.truncate_from_end(11)
    assert c.entries == ((0, 0), (2, 10))
    c.truncate_from_end(0)
    assert c.entries == ()


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (0, ((0, 0), (2, 10), (4, 20))),
        (5, ((0, 5), (2, 10), (4, 20))),
        (10, ((2, 10), (4, 20))),
        (15, ((2, 15), (4, 20))),
        (25, ((4, 25),)),
    ],
)
def test_truncate_from_start(start, expected):
    c = cache((0, 0), (2, 10), (4, 20))
    c.truncate_from_start(start)
    assert c.entries == expected


def test_epoch_for_offset():
    c = cache((1, 10), (3, 20))
    assert c.epoch_for_offset(5) == -1
    assert c.epoch_for_offset(10) == 1
    assert c.epoch_for_offset(19) == 1
    assert c.epoch_for_offset(20) == 3
    assert c.epoch_for_offset(1_000) == 3


def test_start_offset_of():
    c = cache((1, 10), (3, 20))
    assert c.start_offset_of(3) == 20
    assert c.start_offset_of(1) == 10
    assert c.start_offset_of(2) is None


def test_changes_are_checkpointed_by_flush_and_load_back(tmp_path):
    c = LeaderEpochCache.load(tmp_path)
    assert c.entries == ()
    c.assign(0, 0)
    c.assign(5, 42)
    assert c.dirty and not (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).exists(), "not written per change"
    assert c.flush()
    assert not c.dirty and not c.flush(), "nothing changed: no write"
    assert LeaderEpochCache.load(tmp_path).entries == ((0, 0), (5, 42))
    c.truncate_from_end(42)
    assert LeaderEpochCache.load(tmp_path).entries == ((0, 0), (5, 42))
    c.flush()
    assert LeaderEpochCache.load(tmp_path).entries == ((0, 0),)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n1\n0 0\n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "1\n1\n0 0\n",  # unknown version
        "0\n2\n0 0\n",  # fewer entries than announced
        "0\n2\n3 10\n1 20\n",  # out of order
        "0\n1\n-1 0\n",
    ],
)
def test_a_malformed_checkpoint_reads_as_unknown_and_loads_as_empty(tmp_path, text):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_text(text)
    assert read_checkpoint(path) is None
    assert LeaderEpochCache.load(tmp_path).entries == ()


def test_a_missing_checkpoint_reads_as_unknown_and_one_without_entries_as_empty(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    assert read_checkpoint(path) is None
    path.write_text("0\n0\n")
    assert read_checkpoint(path) == ()


def test_entries_out_of_order_are_refused():
    with pytest.raises(ValueError):
        cache((2, 0), (1, 10))


def test_a_flush_up_to_an_offset_writes_only_when_the_entries_below_it_changed(tmp_path):
    c = LeaderEpochCache.load(tmp_path)
    c.assign(0, 0)
    c.assign(3, 10)
    assert not c.needs_flush(0), "no offset below 0: nothing the log makes durable depends on them"
    assert not c.flush(below=0) and not (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).exists()
    assert c.needs_flush(5) and not c.needs_flush(0)
    assert c.flush(below=5)
    assert LeaderEpochCache.load(tmp_path).entries == ((0, 0), (3, 10)), "written whole"
    c.assign(4, 12)  # an epoch that wrote nothing below 12 yet
    assert c.dirty and not c.needs_flush(12) and c.needs_flush(13)
