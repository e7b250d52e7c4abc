"""AppendNotifier: one future watches many partitions, and giving it back leaves nothing behind."""

from __future__ import annotations

import asyncio

from storage_node.notifier import AppendNotifier

KEYS = [("t", p) for p in range(256)]


def test_a_watch_completes_at_the_first_append_to_any_of_its_partitions():
    async def scenario():
        notifier = AppendNotifier()
        first, second = notifier.watch(KEYS), notifier.watch(KEYS[:10])
        notifier.notify(("u", 0))  # not watched
        notifier.notify(("t", 200))
        assert first.done() and not second.done()
        notifier.notify(("t", 3))
        assert second.done()
        notifier.notify(("t", 3))  # again: nothing left to complete, no error
        notifier.unwatch(KEYS, first)
        notifier.unwatch(KEYS[:10], second)
        assert notifier.watched() == 0

    asyncio.run(scenario())


def test_watches_given_back_unanswered_leave_no_entries():
    """A quiet partition watched by long poll after long poll must not pile their futures up."""

    async def scenario():
        notifier = AppendNotifier()
        for _ in range(100):
            watcher = notifier.watch(KEYS)
            notifier.unwatch(KEYS, watcher)
        assert notifier.watched() == 0
        kept = notifier.watch(KEYS[:2])
        other = notifier.watch(KEYS[1:3])
        notifier.unwatch(KEYS[1:3], other)
        assert notifier.watched() == 2  # t-0 and t-1 still watched by the first
        notifier.notify(("t", 1))
        assert kept.done() and not other.done()

    asyncio.run(scenario())


def test_next_append_still_serves_single_partition_waits():
    async def scenario():
        notifier = AppendNotifier()
        waiting = asyncio.create_task(notifier.wait(("t", 0), 5.0))
        await asyncio.sleep(0)
        watcher = notifier.watch([("t", 0)])
        notifier.notify(("t", 0))
        assert await waiting and watcher.done()
        assert not await notifier.wait(("t", 0), 0.01)

    asyncio.run(scenario())
