"""The coordinator's client-quota keys (coordinator/quotas.py): one key per entity, the cache the
cluster watch feeds, and the write an alteration makes."""

from __future__ import annotations

import asyncio

from coordinator.quotas import QuotaCache, alter_ops, decode_entry, encode_entry, quota_key
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync
from services.quotas import DEFAULT, PRODUCER_BYTE_RATE, QuotaEntity, QuotaFilter


def kv(key: str, value: bytes, revision: int = 1) -> KeyValue:
    return KeyValue(key, value, revision, revision, 1)


def test_entries_round_trip_and_keys_depend_on_the_entity_only():
    entity = QuotaEntity("alice/x", DEFAULT)
    assert decode_entry(encode_entry(entity, {PRODUCER_BYTE_RATE: 10.0})) == (
        entity,
        {PRODUCER_BYTE_RATE: 10.0},
    )
    assert quota_key(entity) == quota_key(QuotaEntity("alice/x", DEFAULT))
    assert quota_key(entity) != quota_key(QuotaEntity("alice/x", None))
    assert quota_key(QuotaEntity(None, "a")) != quota_key(QuotaEntity("a", None))
    assert quota_key(entity).startswith("quotas/") and "/" not in quota_key(entity)[len("quotas/") :]


def test_an_alteration_that_leaves_nothing_deletes_the_key():
    entity = QuotaEntity(None, "app")
    (put,) = alter_ops(entity, {PRODUCER_BYTE_RATE: 5.0})
    (delete,) = alter_ops(entity, {})
    assert put.key == delete.key == quota_key(entity)
    assert put != delete


def test_the_cache_follows_the_watch_and_skips_bad_values():
    async def run() -> None:
        cache = QuotaCache()
        app, alice = QuotaEntity(None, "app"), QuotaEntity("alice", None)
        cache.apply(
            WatchResync(
                (
                    kv(quota_key(app), encode_entry(app, {PRODUCER_BYTE_RATE: 1.0})),
                    kv("topics/t", b"{}"),
                    kv(
                        "quotas/bad",
                        b'{"user": null, "client_id": "x", "values": {"producer_byte_rate": -5}}',
                    ),
                ),
                revision=3,
            )
        )
        assert cache.values_of(app) == {PRODUCER_BYTE_RATE: 1.0}
        assert len(cache.entries) == 1  # the negative rate was not taken in
        version = cache.version
        waiter = asyncio.ensure_future(cache.wait_changed(version, timeout=5))
        cache.apply(
            [
                WatchEvent(
                    EventType.PUT, kv(quota_key(alice), encode_entry(alice, {PRODUCER_BYTE_RATE: 2.0}), 4)
                )
            ]
        )
        assert await waiter is True
        assert [e for e, _ in cache.matching(QuotaFilter())] == [app, alice]
        cache.apply([WatchEvent(EventType.DELETE, kv(quota_key(app), b"", 5))])
        assert cache.values_of(app) == {}
        assert await cache.wait_changed(cache.version, timeout=0.01) is False

    asyncio.run(run())
