import asyncio

from gateway.server.partition_retry import retry_partitions
from services import errors
from services.append_result import AppendResult


def test_each_key_is_reported_final_as_soon_as_it_is_and_the_retried_ones_after_their_retry():
    async def scenario():
        attempts: list[list[int]] = []
        final: list[tuple[int, int]] = []  # (key, attempt it was reported after)

        async def attempt(keys, deadline):
            attempts.append(list(keys))
            results = {}
            for k in keys:
                retry = k == 1 and len(attempts) < 3  # key 1 fails retriably twice
                error = errors.NotLeaderOrFollowerError("moved") if retry else None
                results[k] = AppendResult("t", k, error=error)
            return results

        async def refresh():
            return None

        loop = asyncio.get_running_loop()
        results = await retry_partitions(
            [0, 1, 2],
            attempt,
            refresh=refresh,
            deadline=loop.time() + 10,
            on_final=lambda k, r: final.append((k, len(attempts))),
        )
        return attempts, final, results

    attempts, final, results = asyncio.run(scenario())
    assert attempts == [[0, 1, 2], [1], [1]]
    assert final == [(0, 1), (2, 1), (1, 3)]
    assert all(r.error is None for r in results.values())


def test_keys_still_failing_at_the_deadline_are_reported_final_with_their_error():
    async def scenario():
        final = []

        async def attempt(keys, deadline):
            return {k: AppendResult("t", k, error=errors.NotLeaderOrFollowerError("moved")) for k in keys}

        async def refresh():
            return None

        loop = asyncio.get_running_loop()
        await retry_partitions(
            [7],
            attempt,
            refresh=refresh,
            deadline=loop.time() + 0.01,
            on_final=lambda k, r: final.append((k, r)),
        )
        return final

    ((key, result),) = asyncio.run(scenario())
    assert key == 7 and isinstance(result.error, errors.NotLeaderOrFollowerError)


def test_a_first_attempt_already_made_is_taken_as_the_first_round():
    async def scenario():
        attempts: list[list[int]] = []
        final: list[int] = []
        refreshed = []

        async def attempt(keys, deadline):
            attempts.append(list(keys))
            return {k: AppendResult("t", k, base_offset=7) for k in keys}

        async def refresh():
            refreshed.append(True)

        loop = asyncio.get_running_loop()
        first = {
            0: AppendResult("t", 0, base_offset=3),
            1: AppendResult("t", 1, error=errors.NotLeaderOrFollowerError("moved")),
        }
        results = await retry_partitions(
            [0, 1],
            attempt,
            refresh=refresh,
            deadline=loop.time() + 10,
            on_final=lambda k, r: final.append(k),
            first=first,
        )
        return attempts, final, refreshed, results

    attempts, final, refreshed, results = asyncio.run(scenario())
    assert attempts == [[1]]  # only the refused key, after a refresh
    assert refreshed == [True]
    assert final == [0, 1]
    assert results[0].base_offset == 3 and results[1].base_offset == 7
